#include "comfuse/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace comfuse {

std::string_view name_of(DType t) {
  switch (t) {
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F32: return "f32";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view s) {
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "half") return DType::F16;
  if (s == "f32" || s == "fp32" || s == "float32" || s == "float") return DType::F32;
  return std::nullopt;
}

std::size_t size_of(DType t) { return t == DType::F32 ? 4 : 2; }

DType promote(DType a, DType b) {
  if (a == b) return a;
  return DType::F32;
}

namespace {
// Round to a binary format with `mant` explicit mantissa bits and exponent range
// [emin, emax] (normal numbers), with gradual underflow, by scaling: exact in double
// for every format narrower than double.
double round_generic(double x, int mant, int emin, int emax) {
  if (!std::isfinite(x) || x == 0.0) return x;
  int e;
  std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
  int exp = e - 1;    // x = g * 2^exp, g in [1, 2)
  if (exp < emin) exp = emin;  // subnormal: fixed quantum
  const double quantum = std::ldexp(1.0, exp - mant);
  double r = std::nearbyint(x / quantum) * quantum;  // default rounding mode: nearest-even
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -mant), emax);
  if (std::fabs(r) > max_finite) return std::copysign(INFINITY, x);
  return r;
}
}  // namespace

double round_to(DType t, double x) {
  switch (t) {
    case DType::BF16: return round_generic(x, 7, -126, 127);
    case DType::F16: return round_generic(x, 10, -14, 15);
    case DType::F32: return static_cast<double>(static_cast<float>(x));
  }
  return x;
}

}  // namespace comfuse
