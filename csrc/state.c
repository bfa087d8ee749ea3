/* state.c: the module state's life (state.h): one table of the parts, each
 * with what it does at module exec, once torch imports, and for the GC. */
#include "state.h"

static int
torch_bind(rt_state *st, const rt_release_names *names, PyObject *cpp)
{
    return rt_torch_bind(st, cpp, names->input_grad_buffers);
}

static int
aot_bind(rt_state *st, const rt_release_names *names, PyObject *cpp)
{
    (void)cpp;
    return rt_aot_bind(st, names);
}

static int
dynamo_bind(rt_state *st, const rt_release_names *names, PyObject *cpp)
{
    (void)names, (void)cpp;
    return rt_dynamo_bind(st);
}

static int
thread_locals_init(rt_state *st)
{
    return rt_thread_locals_init(&st->thread_locals);
}

static int
thread_locals_traverse(rt_state *st, visitproc visit, void *arg)
{
    return rt_thread_locals_traverse(&st->thread_locals, visit, arg);
}

static void
thread_locals_clear(rt_state *st)
{
    rt_thread_locals_clear(&st->thread_locals);
}

static int
config_reader_traverse(rt_state *st, visitproc visit, void *arg)
{
    return rt_config_reader_traverse(&st->config_reader, visit, arg);
}

static void
config_reader_clear(rt_state *st)
{
    rt_config_reader_clear(&st->config_reader);
}

/* The parts, in the order they are made and bound; the door binds last
 * of all (its C++ table is in use only once every part is bound) and is
 * cleared last. NULL: nothing to do at that step. The config reader is
 * bound by its own shim (_C._bind_config_read), compile_wrapper's and the
 * disable wrapper's states too (_C._bind_compile_wrapper, _C._bind_disable):
 * each only once the shim verified the upstream code it reads. */
static const struct {
    int (*init)(rt_state *);
    int (*bind)(rt_state *, const rt_release_names *, PyObject *);
    int (*traverse)(rt_state *, visitproc, void *);
    void (*clear)(rt_state *);
} PARTS[] = {
    {thread_locals_init, NULL, thread_locals_traverse, thread_locals_clear},
    {NULL, NULL, config_reader_traverse, config_reader_clear},
    {rt_aot_init, aot_bind, rt_aot_traverse, rt_aot_clear},
    {rt_dynamo_init, dynamo_bind, rt_dynamo_traverse, rt_dynamo_clear},
    {rt_inductor_init, NULL, rt_inductor_traverse, rt_inductor_clear},
    {rt_torch_init, torch_bind, rt_torch_traverse, rt_torch_clear},
};
#define N_PARTS (sizeof(PARTS) / sizeof(PARTS[0]))

int
rt_state_init(rt_state *st)
{
    for (size_t i = 0; i < N_PARTS; i++) {
        if (PARTS[i].init != NULL && PARTS[i].init(st) < 0) {
            return -1;
        }
    }
    return 0;
}

int
rt_state_bind(rt_state *st, const rt_release_names *names, PyObject *cpp_capsule)
{
    if (st->torch.bound) {
        return 0;
    }
    for (size_t i = 0; i < N_PARTS; i++) {
        if (PARTS[i].bind != NULL && PARTS[i].bind(st, names, cpp_capsule) < 0) {
            return -1;
        }
    }
    st->torch.bound = 1;
    return 0;
}

int
rt_state_traverse(rt_state *st, visitproc visit, void *arg)
{
    for (size_t i = 0; i < N_PARTS; i++) {
        int rc = PARTS[i].traverse(st, visit, arg);
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

void
rt_state_clear(rt_state *st)
{
    for (size_t i = 0; i < N_PARTS; i++) {
        PARTS[i].clear(st);
    }
}
