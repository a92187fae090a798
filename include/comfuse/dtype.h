#pragma once
// Storage element types and the rounding the CPU reference applies where a graph stores.
#include <cstddef>
#include <optional>
#include <string_view>

namespace comfuse {

enum class DType { BF16, F16, F32 };

std::string_view name_of(DType t);                        // "bf16", "f16", "f32"
std::optional<DType> dtype_from_name(std::string_view s); // also accepts fp16/fp32/half/float
std::size_t size_of(DType t);
// The wider of two types for mixed arithmetic (bf16 with f16 widens to f32).
DType promote(DType a, DType b);

// Round a double to the nearest value representable in `t` (round-to-nearest-even,
// overflow to inf, NaN preserved), returned as a double.
double round_to(DType t, double x);

}  // namespace comfuse
