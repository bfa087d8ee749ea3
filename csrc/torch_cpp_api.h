/* torch_cpp_api: the plain C interface of the optional C++ part.
 *
 * csrc/cpp/ is built against the torch installed at build time (ATen, c10
 * headers, linked to its libraries) as the extension module
 * torch_aot_rt._torch_cpp_<torch version>. It exports one capsule holding an
 * rt_cpp_api; the shim (torch_aot_rt/_cpp.py) imports it only when the
 * running torch is the one it was built against, and hands it to
 * _C._bind_torch. torch_api.c then calls these pointers instead of the
 * Python-visible callables; with no capsule (not built, switched off with
 * TORCH_AOT_RT_CPP=0, another torch) the C core runs alone, unchanged.
 *
 * Each entry is exact only in the state it names; the caller checks that
 * state (for example: no torch function mode active) and otherwise goes
 * through the Python callable, as upstream does.
 */
#ifndef TORCH_AOT_RT_TORCH_CPP_API_H
#define TORCH_AOT_RT_TORCH_CPP_API_H

#ifdef __cplusplus
extern "C" {
#endif

#define RT_CPP_API_VERSION 1
#define RT_CPP_CAPSULE_NAME "torch_aot_rt._torch_cpp.api"

typedef struct rt_cpp_api {
    int api_version; /* RT_CPP_API_VERSION */
    /* at::impl::torch_function_mode_enabled(): a TorchFunctionMode would
     * intercept torch._C._set_grad_enabled / _set_view_replay_enabled, so
     * the C++ setters below are only exact when this is 0. */
    int (*torch_function_mode_enabled)(void);
    /* c10::GradMode::is_enabled / set_enabled: what torch._C.is_grad_enabled()
     * and torch._C._set_grad_enabled(b) do once their arguments are parsed. */
    int (*grad_enabled)(void);
    void (*set_grad_enabled)(int enabled);
    /* c10::AutogradState view replay: torch._C._is_view_replay_enabled() and
     * torch._C._set_view_replay_enabled(b). */
    int (*view_replay_enabled)(void);
    void (*set_view_replay_enabled)(int enabled);
} rt_cpp_api;

#ifdef __cplusplus
}
#endif

#endif /* TORCH_AOT_RT_TORCH_CPP_API_H */
