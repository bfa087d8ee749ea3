// The C++ part as one translation unit: what setup.py compiles. Each file
// below includes torch's headers, and parsing them is nearly all of a
// file's compile time (about 30 s each with -g on 2 cores, against 37 s for
// all six here): one unit builds the part in a fifth of the time, on every
// install and every CI set-up. The files stay one job each; names private to
// one of them are in an anonymous namespace or static, so none collide.
// tests/cpp/test_build.py checks that every .cpp of this folder is listed, once.
#include "compiled_node.cpp"
#include "compiled_node_compiled_autograd.cpp"
#include "compiled_node_face.cpp"
#include "compiled_node_face_owned.cpp"
#include "epilogue_ops.cpp"
#include "torch_cpp.cpp"
