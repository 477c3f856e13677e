// cublas.cpp — cocoviz emulation of the cuBLAS calls that emitted programs make (see
// include/cublas_v2.h for what is emulated). Argument checks follow cuBLAS: an invalid
// handle, value or type combination returns cuBLAS's status (the program's CHECK_CUBLAS then
// reports the call and aborts) and adds a note saying what was wrong; device ranges are
// checked by the core, which ends the run on a range outside its allocation.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

// The emulated GEMM multiplies and adds separately (see cublas_v2.h): keep the compiler from
// fusing them, whatever the build flags.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace emu = ::cocoviz_emu;

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasPointerMode_t mode = CUBLAS_POINTER_MODE_HOST;
  bool destroyed = false;
  void* workspace = nullptr;  // cublasSetWorkspace's (nullptr: the default pool)
  size_t workspace_bytes = 0;
};

namespace {

// Every handle ever created; never freed, so a destroyed handle is still recognized.
std::vector<std::unique_ptr<cublasContext>>& handles() {
  static std::vector<std::unique_ptr<cublasContext>> h;
  return h;
}

cublasStatus_t invalid(cublasStatus_t code, const std::string& why) {
  emu::note(why + " (at " + emu::site_text(emu::site()) + ")");
  return code;
}

// The handle if it is live; otherwise nullptr, after a note unless the handle is null.
cublasContext* live_handle(cublasHandle_t h, const char* call) {
  if (h == nullptr) return nullptr;
  for (const auto& x : handles()) {
    if (x.get() == h) {
      if (!x->destroyed) return h;
      invalid(CUBLAS_STATUS_NOT_INITIALIZED, std::string(call) + " on a destroyed cuBLAS handle");
      return nullptr;
    }
  }
  invalid(CUBLAS_STATUS_NOT_INITIALIZED,
          std::string(call) + " on a handle that cublasCreate did not return");
  return nullptr;
}

std::string hex(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

const char* type_name(cudaDataType t) {
  switch (t) {
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_32I: return "CUDA_R_32I";
    case CUDA_R_64I: return "CUDA_R_64I";
    default: return "an unknown cudaDataType";
  }
}

const char* compute_name(cublasComputeType_t c) {
  switch (c) {
    case CUBLAS_COMPUTE_16F: return "CUBLAS_COMPUTE_16F";
    case CUBLAS_COMPUTE_16F_PEDANTIC: return "CUBLAS_COMPUTE_16F_PEDANTIC";
    case CUBLAS_COMPUTE_32F: return "CUBLAS_COMPUTE_32F";
    case CUBLAS_COMPUTE_32F_PEDANTIC: return "CUBLAS_COMPUTE_32F_PEDANTIC";
    case CUBLAS_COMPUTE_32F_FAST_16F: return "CUBLAS_COMPUTE_32F_FAST_16F";
    case CUBLAS_COMPUTE_32F_FAST_16BF: return "CUBLAS_COMPUTE_32F_FAST_16BF";
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "CUBLAS_COMPUTE_32F_FAST_TF32";
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9: return "CUBLAS_COMPUTE_32F_EMULATED_16BFX9";
    case CUBLAS_COMPUTE_64F: return "CUBLAS_COMPUTE_64F";
    case CUBLAS_COMPUTE_64F_PEDANTIC: return "CUBLAS_COMPUTE_64F_PEDANTIC";
    case CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT: return "CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT";
    case CUBLAS_COMPUTE_32I: return "CUBLAS_COMPUTE_32I";
    case CUBLAS_COMPUTE_32I_PEDANTIC: return "CUBLAS_COMPUTE_32I_PEDANTIC";
  }
  return "an unknown cublasComputeType_t";
}

size_t type_size(cudaDataType t) {
  switch (t) {
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    default: return 0;
  }
}

// How a supported combination computes: the accumulator, and the type of alpha and beta.
enum class Acc { f16, f32, f64 };

bool supported(cudaDataType ab, cudaDataType c, cublasComputeType_t ct, Acc* acc) {
  switch (ct) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      *acc = Acc::f32;
      return ((ab == CUDA_R_16F || ab == CUDA_R_16BF) && (c == ab || c == CUDA_R_32F)) ||
             (ab == CUDA_R_32F && c == CUDA_R_32F);
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9:
      *acc = Acc::f32;  // the down-conversion of the inputs is not emulated
      return ab == CUDA_R_32F && c == CUDA_R_32F;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
    case CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT:
      *acc = Acc::f64;
      return ab == CUDA_R_64F && c == CUDA_R_64F;
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC:
      *acc = Acc::f16;
      return ab == CUDA_R_16F && c == CUDA_R_16F;
    default:
      return false;
  }
}

size_t scale_size(Acc a) { return a == Acc::f64 ? 8 : a == Acc::f32 ? 4 : 2; }

// Reads a scale (alpha, beta) of the compute's scale type, exactly, as a double.
double read_scale(const void* p, Acc a) {
  switch (a) {
    case Acc::f16: return static_cast<double>(__half2float(*static_cast<const __half*>(p)));
    case Acc::f32: return static_cast<double>(*static_cast<const float*>(p));
    case Acc::f64: return *static_cast<const double*>(p);
  }
  return 0;
}

// Element `i` of an array of type t, exactly, as a double.
double load(const void* base, cudaDataType t, size_t i) {
  switch (t) {
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(base)[i]);
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case CUDA_R_32F: return static_cast<const float*>(base)[i];
    case CUDA_R_64F: return static_cast<const double*>(base)[i];
    default: return 0;
  }
}

// Stores v (a value of the accumulator type) into element `i`, rounded to nearest even.
void store(void* base, cudaDataType t, size_t i, double v) {
  switch (t) {
    case CUDA_R_16F: static_cast<__half*>(base)[i] = __double2half(v); break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(base)[i] = __double2bfloat16(v); break;
    case CUDA_R_32F: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case CUDA_R_64F: static_cast<double*>(base)[i] = v; break;
    default: break;
  }
}

// x + y rounded once to the nearest half (x, y exact doubles): the rounding error of the
// double sum (TwoSum) makes it round to odd, which a later rounding to 11 bits cannot
// distinguish from the exact sum.
double half_sum(double x, double y) {
  double s = x + y;
  const double bb = s - x;
  const double e = (x - (s - bb)) + (y - bb);
  if (e != 0 && std::isfinite(s)) {
    uint64_t u;
    std::memcpy(&u, &s, sizeof u);
    if ((e > 0) != (s > 0)) --u;  // s was rounded away from zero: truncate
    u |= 1u;
    std::memcpy(&s, &u, sizeof s);
  }
  return static_cast<double>(__half2float(__double2half(s)));
}

// The matrix op(X) (rows x k, or k x cols) gathered so that each of its `outer` vectors of
// length k is contiguous: out[o * k + p] = X[o + p * ld] when `o_contiguous`, else
// X[p + o * ld].
template <class T>
std::vector<T> gather(const void* X, cudaDataType t, bool o_contiguous, int outer, int k,
                      int ld) {
  const size_t so = static_cast<size_t>(outer), sk = static_cast<size_t>(k);
  const size_t sld = static_cast<size_t>(ld);
  std::vector<T> out(so * sk);
  for (size_t o = 0; o < so; ++o) {
    for (size_t p = 0; p < sk; ++p) {
      out[o * sk + p] = static_cast<T>(load(X, t, o_contiguous ? o + p * sld : p + o * sld));
    }
  }
  return out;
}

// C = alpha * opA * opB + beta * C with a float or double accumulator (T), summed in k order.
template <class T>
void gemm_float(const std::vector<T>& a, const std::vector<T>& b, int m, int n, int k,
                double alpha_d, double beta_d, void* C, cudaDataType ct, int ldc) {
  const T alpha = static_cast<T>(alpha_d), beta = static_cast<T>(beta_d);
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      const T* ai = a.data() + static_cast<size_t>(i) * static_cast<size_t>(k);
      const T* bj = b.data() + static_cast<size_t>(j) * static_cast<size_t>(k);
      T acc = 0;
      for (int p = 0; p < k; ++p) {
        const T prod = ai[p] * bj[p];
        acc = acc + prod;
      }
      const size_t at = static_cast<size_t>(i) + static_cast<size_t>(j) * static_cast<size_t>(ldc);
      T r = alpha * acc;
      if (beta != 0) {
        const T c = static_cast<T>(load(C, ct, at));
        const T bc = beta * c;
        r = r + bc;
      }
      store(C, ct, at, static_cast<double>(r));
    }
  }
}

// The same with a half accumulator: each step acc = a * b + acc rounded once (a fused
// multiply-add in half), and C = alpha * acc + beta * C rounded once.
void gemm_half(const std::vector<double>& a, const std::vector<double>& b, int m, int n, int k,
               double alpha, double beta, void* C, int ldc) {
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      const double* ai = a.data() + static_cast<size_t>(i) * static_cast<size_t>(k);
      const double* bj = b.data() + static_cast<size_t>(j) * static_cast<size_t>(k);
      double acc = 0;
      for (int p = 0; p < k; ++p) acc = half_sum(ai[p] * bj[p], acc);  // product exact
      const size_t at = static_cast<size_t>(i) + static_cast<size_t>(j) * static_cast<size_t>(ldc);
      const double r = beta != 0 ? half_sum(alpha * acc, beta * load(C, CUDA_R_16F, at))
                                 : alpha * acc;  // exact: rounded once below
      static_cast<__half*>(C)[at] = __double2half(r);
    }
  }
}

// A matrix argument as stored: `rows` x `cols` elements of `size` bytes, leading dimension ld.
struct Operand {
  const char* name;
  const void* p;
  size_t size;
  int rows, cols, ld;
  size_t extent() const {  // bytes from p to the end of the last column
    if (rows == 0 || cols == 0) return 0;
    return ((static_cast<size_t>(cols) - 1) * static_cast<size_t>(ld) + static_cast<size_t>(rows)) *
           size;
  }
  void check(const std::string& desc) const {
    if (extent() != 0) emu::check_range(p, extent(), std::string("cublasGemmEx ") + name + desc);
  }
  void access(bool write) const {
    if (extent() == 0) return;
    const size_t col = static_cast<size_t>(rows) * size;
    if (ld == rows) {
      emu::access(p, extent(), write);
      return;
    }
    for (int j = 0; j < cols; ++j) {
      const size_t off = static_cast<size_t>(j) * static_cast<size_t>(ld) * size;
      emu::access(static_cast<const char*>(p) + off, col, write);
    }
  }
};

bool valid_op(cublasOperation_t op) {
  return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

bool valid_algo(cublasGemmAlgo_t a) {
  const int v = static_cast<int>(a);
  return v == -1 || (v >= 0 && v <= 23) || (v >= 99 && v <= 115) || v == 999;
}

const char* op_letter(cublasOperation_t op) {
  return op == CUBLAS_OP_N ? "N" : op == CUBLAS_OP_T ? "T" : "C";
}

}  // namespace

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unrecognized status";
}

// The texts of cuBLAS 13.
const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "the function requires an architectural feature absent from the device";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the function failed to launch on the GPU";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the license check failed";
  }
  return "unrecognized status";
}

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return invalid(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate(nullptr)");
  handles().push_back(std::make_unique<cublasContext>());
  *handle = handles().back().get();
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS documents that cublasDestroy synchronizes the device.
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  cublasContext* h = live_handle(handle, "cublasDestroy");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  emu::host_sync_device();
  h->destroyed = true;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  cublasContext* h = live_handle(handle, "cublasSetStream");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!emu::stream_valid(stream)) {
    return invalid(CUBLAS_STATUS_INVALID_VALUE,
                   "cublasSetStream with a destroyed or unknown stream " + hex(stream));
  }
  h->stream = stream;
  h->workspace = nullptr;  // "unconditionally resets the cuBLAS library workspace" (cuBLAS)
  h->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  cublasContext* h = live_handle(handle, "cublasSetWorkspace");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return invalid(CUBLAS_STATUS_INVALID_VALUE,
                   "cublasSetWorkspace: the workspace " + hex(workspace) + " is not aligned to 256 bytes");
  }
  if (bytes > 0) emu::check_range(workspace, bytes, "cublasSetWorkspace workspace");
  h->workspace = workspace;
  h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  cublasContext* h = live_handle(handle, "cublasGetStream");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = h->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t* mode) {
  cublasContext* h = live_handle(handle, "cublasGetPointerMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = h->mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  cublasContext* h = live_handle(handle, "cublasSetPointerMode");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  h->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  cublasContext* h = live_handle(handle, "cublasGemmEx");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const auto bad = [](const std::string& why) {
    return invalid(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmEx: " + why);
  };
  if (!valid_op(transa) || !valid_op(transb)) return bad("transa/transb must be N, T or C");
  if (m < 0 || n < 0 || k < 0) {
    return bad("negative size m=" + std::to_string(m) + " n=" + std::to_string(n) +
               " k=" + std::to_string(k));
  }
  // A is stored m x k (N) or k x m (T); B is stored k x n (N) or n x k (T).
  const int a_rows = transa == CUBLAS_OP_N ? m : k, a_cols = transa == CUBLAS_OP_N ? k : m;
  const int b_rows = transb == CUBLAS_OP_N ? k : n, b_cols = transb == CUBLAS_OP_N ? n : k;
  const auto max1 = [](int x) { return x > 1 ? x : 1; };
  if (lda < max1(a_rows)) {
    return bad("lda=" + std::to_string(lda) + " < max(1, " + std::to_string(a_rows) +
               "), the rows of A as stored (transa=" + op_letter(transa) + ")");
  }
  if (ldb < max1(b_rows)) {
    return bad("ldb=" + std::to_string(ldb) + " < max(1, " + std::to_string(b_rows) +
               "), the rows of B as stored (transb=" + op_letter(transb) + ")");
  }
  if (ldc < max1(m)) {
    return bad("ldc=" + std::to_string(ldc) + " < max(1, m=" + std::to_string(m) + ")");
  }
  if (alpha == nullptr || beta == nullptr) return bad("alpha or beta is null");
  if (!valid_algo(algo)) return bad("unknown algorithm " + std::to_string(static_cast<int>(algo)));
  Acc acc = Acc::f32;
  if (Atype != Btype || !supported(Atype, Ctype, computeType, &acc)) {
    return invalid(CUBLAS_STATUS_NOT_SUPPORTED,
                   std::string("cublasGemmEx: A ") + type_name(Atype) + ", B " +
                       type_name(Btype) + ", C " + type_name(Ctype) + " with " +
                       compute_name(computeType) + " is not supported (or not emulated)");
  }
  if (!emu::stream_valid(h->stream)) {
    return invalid(CUBLAS_STATUS_EXECUTION_FAILED,
                   "cublasGemmEx on the handle's stream " + hex(h->stream) +
                       ", which was destroyed");
  }
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;  // nothing to compute: no kernel

  // Scales: on the host in CUBLAS_POINTER_MODE_HOST, in device memory (read by the GEMM)
  // in CUBLAS_POINTER_MODE_DEVICE.
  const size_t ss = scale_size(acc);
  const bool dev_scales = h->mode == CUBLAS_POINTER_MODE_DEVICE;
  for (const void* s : {alpha, beta}) {
    const char* which = s == alpha ? "alpha" : "beta";
    if (dev_scales) {
      emu::check_range(s, ss, std::string("cublasGemmEx ") + which +
                                  " (CUBLAS_POINTER_MODE_DEVICE: must be device memory)");
    } else if (emu::is_device_pointer(s)) {
      emu::fail("cuBLAS pointer mode",
                std::string("cublasGemmEx: ") + which + " " + hex(s) +
                    " is device memory, but the handle's pointer mode is "
                    "CUBLAS_POINTER_MODE_HOST (the default), so cuBLAS reads it on the host");
    }
  }

  const size_t es = type_size(Atype), cs = type_size(Ctype);
  const Operand a{"A", A, es, a_rows, a_cols, lda};
  const Operand b{"B", B, es, b_rows, b_cols, ldb};
  const Operand c{"C", C, cs, m, n, ldc};
  const auto desc = [](const Operand& x, cudaDataType t, const char* ld) {
    return " (" + std::to_string(x.rows) + " x " + std::to_string(x.cols) + " " +
           type_name(t) + ", " + ld + "=" + std::to_string(x.ld) + ")";
  };
  a.check(desc(a, Atype, "lda"));
  b.check(desc(b, Btype, "ldb"));
  c.check(desc(c, Ctype, "ldc"));

  // Runs on the handle's stream at enqueue, or at every launch of a graph that captured it.
  // Host scales are read now (cuBLAS captures their values); device scales when it runs.
  emu::Stream* st = emu::resolve_stream(h->stream, "cublasGemmEx");
  const double host_alpha = dev_scales ? 0 : read_scale(alpha, acc);
  const double host_beta = dev_scales ? 0 : read_scale(beta, acc);
  void* const ws = h->workspace;  // the workspace is part of the call, as a graph keeps it
  const size_t ws_touched = h->workspace_bytes < 256 ? h->workspace_bytes : 256;
  const int err = emu::enqueue(st, [=] {
    emu::Op op(st, std::string("cublasGemmEx(") + op_letter(transa) + ", " + op_letter(transb) +
                       ", m=" + std::to_string(m) + ", n=" + std::to_string(n) +
                       ", k=" + std::to_string(k) + ")");
    if (dev_scales) {
      emu::access(alpha, ss, false);
      emu::access(beta, ss, false);
    }
    const double alpha_v = dev_scales ? read_scale(alpha, acc) : host_alpha;
    const double beta_v = dev_scales ? read_scale(beta, acc) : host_beta;
    a.access(false);
    b.access(false);
    if (beta_v != 0) c.access(false);  // beta == 0: C is not read (NaN there does not matter)
    c.access(true);
    if (ws != nullptr) emu::access(ws, ws_touched, true);  // its scratch: the first bytes stand for it

    // op(A)(i, p) is A[i + p * lda] (N) or A[p + i * lda] (T): row i of op(A) contiguous.
    // op(B)(p, j) is B[p + j * ldb] (N) or B[j + p * ldb] (T): column j of op(B) contiguous.
    const bool a_n = transa == CUBLAS_OP_N, b_n = transb == CUBLAS_OP_N;
    switch (acc) {
      case Acc::f32:
        gemm_float<float>(gather<float>(A, Atype, a_n, m, k, lda),
                          gather<float>(B, Btype, !b_n, n, k, ldb), m, n, k, alpha_v, beta_v, C,
                          Ctype, ldc);
        break;
      case Acc::f64:
        gemm_float<double>(gather<double>(A, Atype, a_n, m, k, lda),
                           gather<double>(B, Btype, !b_n, n, k, ldb), m, n, k, alpha_v, beta_v,
                           C, Ctype, ldc);
        break;
      case Acc::f16:
        gemm_half(gather<double>(A, Atype, a_n, m, k, lda),
                  gather<double>(B, Btype, !b_n, n, k, ldb), m, n, k, alpha_v, beta_v, C, ldc);
        break;
    }
  });
  if (err != 0) {
    return invalid(CUBLAS_STATUS_EXECUTION_FAILED,
                   std::string("cublasGemmEx: ") + cudaGetErrorName(static_cast<cudaError_t>(err)));
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  cublasContext* h = live_handle(handle, "cublasGemmStridedBatchedEx");
  if (h == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (batchCount < 0 || strideA < 0 || strideB < 0 || strideC < 0) {
    return invalid(CUBLAS_STATUS_INVALID_VALUE,
                   "cublasGemmStridedBatchedEx: negative batchCount=" +
                       std::to_string(batchCount) + " or stride (strideA=" +
                       std::to_string(strideA) + ", strideB=" + std::to_string(strideB) +
                       ", strideC=" + std::to_string(strideC) + ")");
  }
  const size_t es = type_size(Atype), bs = type_size(Btype), cs = type_size(Ctype);
  for (int i = 0; i < batchCount; ++i) {
    const size_t bi = static_cast<size_t>(i);
    const cublasStatus_t st = cublasGemmEx(
        handle, transa, transb, m, n, k, alpha,
        static_cast<const char*>(A) + bi * static_cast<size_t>(strideA) * es, Atype, lda,
        static_cast<const char*>(B) + bi * static_cast<size_t>(strideB) * bs, Btype, ldb, beta,
        static_cast<char*>(C) + bi * static_cast<size_t>(strideC) * cs, Ctype, ldc, computeType,
        algo);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  return CUBLAS_STATUS_SUCCESS;
}
