/* state.h: the module state of torch_aot_rt._C, one part per layer, each
 * declared in its own folder. The door's part comes first (rt_door); the
 * table in state.c drives every part's {init, bind, traverse, clear}, so no
 * part's code knows another's. */
#ifndef TORCH_AOT_RT_STATE_H
#define TORCH_AOT_RT_STATE_H

#include <stddef.h>

#include "aot/aot_state.h"
#include "config/config_read.h"
#include "dynamo/dynamo.h"
#include "inductor/inductor.h"
#include "torch_api.h"
#include "util/thread_local.h"

struct rt_state {
    rt_torch_state torch;             /* torch_api.h: first, see rt_door */
    rt_thread_locals thread_locals;   /* util/thread_local.h: Dynamo's threading.locals */
    rt_config_reader config_reader;   /* config/config_read.h: settings read per call */
    rt_aot_state aot;                 /* aot/aot_state.h */
    rt_dynamo_state dynamo;           /* dynamo/dynamo.h */
    rt_inductor_state inductor;       /* inductor/inductor.h */
};

_Static_assert(offsetof(struct rt_state, torch) == 0, "rt_door() needs the door's part first");

/* Every part's interned names, at module exec. */
int rt_state_init(rt_state *st);
/* Every part's look-ups, once torch imports (_C._bind_torch): the release's
 * names and the C++ part's capsule (or None). Once only; st->torch.bound
 * says it succeeded. */
int rt_state_bind(rt_state *st, const rt_release_names *names, PyObject *cpp_capsule);
int rt_state_traverse(rt_state *st, visitproc visit, void *arg);
void rt_state_clear(rt_state *st);

#endif
