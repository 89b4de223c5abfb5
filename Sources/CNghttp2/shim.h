#ifndef PINGATE_CNGHTTP2_SHIM_H
#define PINGATE_CNGHTTP2_SHIM_H
// libnghttp2 imports directly; this header only gives the module one entry point.
#include <nghttp2/nghttp2.h>
#endif
