/* The exports model.mjs calls (sw_*), over the C API of the model.h that
 * `sampan deploy --target c` wrote. Compiled beside model.c into model.wasm; it holds no
 * model-specific text: the model's prefix comes as -DSW_PREFIX=<prefix> and
 * -DSW_PREFIX_UPPER=<PREFIX> on the command line. */
#include <stdint.h>
#include <stdlib.h>
#include "model.h"

#define SW_CAT2(a, b) a##_##b
#define SW_CAT(a, b) SW_CAT2(a, b)
#define SW(x) SW_CAT(SW_PREFIX, x)
#define SWU(x) SW_CAT(SW_PREFIX_UPPER, x)
#define EXPORT(name) __attribute__((export_name(#name)))

EXPORT(sw_alloc) void *sw_alloc(uint32_t n) { return malloc(n); }
EXPORT(sw_free) void sw_free(void *p) { free(p); }

EXPORT(sw_create) void *sw_create(const void *bytes, uint32_t n) {
    return SW(create_from_memory)(bytes, (size_t)n);
}
EXPORT(sw_destroy) void sw_destroy(void *m) { SW(destroy)(m); }
EXPORT(sw_error) const char *sw_error(void) { return SW(last_error)(); }

EXPORT(sw_run) int32_t sw_run(void *m, int32_t batch, const void *const *in, void *const *out) {
    return (int32_t)SW(run)(m, (int)batch, in, out);
}

EXPORT(sw_num_inputs) int32_t sw_num_inputs(void) { return (int32_t)SW(num_inputs)(); }
EXPORT(sw_num_outputs) int32_t sw_num_outputs(void) { return (int32_t)SW(num_outputs)(); }
EXPORT(sw_input_name) const char *sw_input_name(int32_t i) { return SW(input)(i)->name; }
EXPORT(sw_output_name) const char *sw_output_name(int32_t i) { return SW(output)(i)->name; }

/* the dtype's numpy name, from model.h's enum */
static const char *dtype_name(int code) {
    switch (code) {
    case SWU(FLOAT32): return "float32";
    case SWU(FLOAT64): return "float64";
    case SWU(INT64): return "int64";
    case SWU(INT32): return "int32";
    case SWU(INT16): return "int16";
    case SWU(INT8): return "int8";
    case SWU(UINT8): return "uint8";
    case SWU(BOOL): return "bool";
    default: return "unknown";
    }
}

EXPORT(sw_input_dtype) const char *sw_input_dtype(int32_t i) { return dtype_name(SW(input)(i)->dtype); }
EXPORT(sw_output_dtype) const char *sw_output_dtype(int32_t i) { return dtype_name(SW(output)(i)->dtype); }
EXPORT(sw_input_rank) int32_t sw_input_rank(int32_t i) { return (int32_t)SW(input)(i)->ndim; }
EXPORT(sw_output_rank) int32_t sw_output_rank(int32_t i) { return (int32_t)SW(output)(i)->ndim; }
EXPORT(sw_input_dim) int32_t sw_input_dim(int32_t i, int32_t j) { return (int32_t)SW(input)(i)->shape[j]; }
EXPORT(sw_output_dim) int32_t sw_output_dim(int32_t i, int32_t j) { return (int32_t)SW(output)(i)->shape[j]; }
