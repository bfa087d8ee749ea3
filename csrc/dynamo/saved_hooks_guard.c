/* saved_hooks_guard.c: SavedHooksGuard, Dynamo's saved-tensor-hooks guard in C.
 *
 * Every frame Dynamo compiles gets the global-state guard
 * GuardBuilder.AUTOGRAD_SAVED_TENSORS_HOOKS (torch/_dynamo/guards.py): a
 * lambda guard that, on every call, recomputes
 *
 *     hooks_ids_fn(top_saved_tensors_hooks()) == guard_hooks_ids
 *
 * with AOTAutograd's helpers (torch/_functorch/_aot_autograd/utils.py):
 *
 *     top_saved_tensors_hooks() = torch._C._autograd._top_saved_tensors_default_hooks(True)
 *     saved_tensors_hooks_are_inlineable(hooks) =
 *         bool(hooks) and both of `pack, unpack = hooks` are fx.GraphModules
 *     hooks_ids_fn(hooks) = tuple(map(id, hooks)) if inlineable else None
 *
 * SavedHooksGuard(expected) is that `fn`, with `expected` the guard_hooks_ids
 * the builder computed (None or a tuple of ints): same result for every state
 * of the hooks stack, same exceptions, no Python frame. torch_aot_rt/_saved_hooks_guard.py
 * installs it where upstream's builder would install its closure.
 * ====================================================================== */
#include "dynamo/dynamo.h"
#include "fn_object.h"

typedef struct {
    RT_FN_HEAD
    PyObject *expected; /* guard_hooks_ids: None or a tuple */
} SavedHooksGuard;

/* hooks_ids_fn(top_saved_tensors_hooks()) == expected, as a new bool */
static PyObject *
SavedHooksGuard_vectorcall(PyObject *op, PyObject *const *argv, size_t nargsf,
                           PyObject *kwnames)
{
    SavedHooksGuard *self = (SavedHooksGuard *)op;
    rt_state *st = self->st;
    /* fn(x): one positional argument, unused */
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "saved-tensors-hooks guard takes one argument");
        return NULL;
    }
    (void)argv;
    PyObject *arg = Py_True;
    PyObject *hooks = PyObject_Vectorcall(st->dynamo.obj.top_saved_hooks, &arg, 1, NULL);
    if (hooks == NULL) {
        return NULL;
    }
    PyObject *ids = NULL;
    int truthy = PyObject_IsTrue(hooks); /* `if not hooks: return False` */
    if (truthy < 0) {
        goto done;
    }
    if (!truthy) {
        ids = Py_NewRef(Py_None);
        goto compare;
    }
    /* pack, unpack = hooks */
    PyObject *seq = PySequence_Fast(hooks, "cannot unpack non-iterable object");
    if (seq == NULL) {
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != 2) {
        if (n < 2) {
            PyErr_Format(PyExc_ValueError,
                         "not enough values to unpack (expected 2, got %zd)", n);
        }
        else {
            PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
        }
        Py_DECREF(seq);
        goto done;
    }
    PyObject *pack = PySequence_Fast_GET_ITEM(seq, 0);
    PyObject *unpack = PySequence_Fast_GET_ITEM(seq, 1);
    int inline_pack = PyObject_IsInstance(pack, st->dynamo.obj.GraphModule);
    int inline_unpack = inline_pack > 0 ? PyObject_IsInstance(unpack, st->dynamo.obj.GraphModule) : 0;
    if (inline_pack < 0 || inline_unpack < 0) {
        Py_DECREF(seq);
        goto done;
    }
    if (inline_pack && inline_unpack) {
        /* tuple(map(id, hooks)) */
        ids = PyTuple_New(2);
        for (Py_ssize_t i = 0; ids != NULL && i < 2; i++) {
            PyObject *id = PyLong_FromVoidPtr(PySequence_Fast_GET_ITEM(seq, i));
            if (id == NULL) {
                Py_CLEAR(ids);
                break;
            }
            PyTuple_SET_ITEM(ids, i, id);
        }
    }
    else {
        ids = Py_NewRef(Py_None);
    }
    Py_DECREF(seq);
    if (ids == NULL) {
        goto done;
    }
compare:;
    /* guard_hooks_ids == ids */
    PyObject *result = PyObject_RichCompare(self->expected, ids, Py_EQ);
    Py_DECREF(ids);
    Py_DECREF(hooks);
    return result;
done:
    Py_DECREF(hooks);
    return NULL;
}

static PyObject *
SavedHooksGuard_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"expected", NULL};
    PyObject *expected;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:SavedHooksGuard", keywords, &expected)) {
        return NULL;
    }
    if (expected != Py_None && !PyTuple_CheckExact(expected)) {
        PyErr_SetString(PyExc_TypeError, "SavedHooksGuard: expected must be None or a tuple");
        return NULL;
    }
    SavedHooksGuard *self = (SavedHooksGuard *)rt_fn_alloc(type, SavedHooksGuard_vectorcall);
    if (self == NULL) {
        return NULL;
    }
    self->expected = Py_NewRef(expected);
    return (PyObject *)self;
}

static int
SavedHooksGuard_traverse(SavedHooksGuard *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->module);
    Py_VISIT(self->dict);
    Py_VISIT(self->expected);
    return 0;
}

static int
SavedHooksGuard_clear(SavedHooksGuard *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->expected);
    return 0;
}

DEFINE_DEALLOC(SavedHooksGuard, (void)0)
FN_MEMBERS(SavedHooksGuard)
FN_SPEC(SavedHooksGuard,
        "SavedHooksGuard(expected): Dynamo's saved-tensor-hooks lambda guard, "
        "hooks_ids_fn(top_saved_tensors_hooks()) == expected, in C.")
