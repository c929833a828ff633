#include "kernel_base.h"

#include "ep.h"

#include <algorithm>
#include <atomic>
#include <sstream>
#include <thread>

namespace hinamoe_ep {

hinamoe::DType to_dtype(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return hinamoe::DType::F16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return hinamoe::DType::BF16;
    default: return hinamoe::DType::F32;
  }
}

OrtStatus* creating_ep(const OrtKernelInfo* info, std::string* node_name, const HinaEp** ep, std::string* refusal) {
  *node_name = Ort::ConstKernelInfo{info}.GetNodeName();
  const OrtEp* base = nullptr;
  HINA_RETURN_IF_ERROR(Ort::GetEpApi().KernelInfo_GetEp(info, &base));
  *ep = static_cast<const HinaEp*>(base);
  *refusal = (*ep)->strict_refusal(*node_name);
  return nullptr;
}

KernelInputs read_inputs(Ort::KernelContext& ctx, int n) {
  KernelInputs in;
  in.value.assign(size_t(n), Ort::ConstValue{nullptr});
  in.shape.resize(size_t(n));
  in.elem.assign(size_t(n), ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED);
  const size_t count = ctx.GetInputCount();
  for (size_t i = 0; i < size_t(n) && i < count; ++i) {
    in.value[i] = ctx.GetInput(i);
    if (in.value[i] == nullptr) continue;
    const auto info = in.value[i].GetTensorTypeAndShapeInfo();
    in.shape[i] = info.GetShape();
    in.elem[i] = info.GetElementType();
  }
  return in;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

namespace {

void ort_parallel_for(void* pool, size_t n, void (*fn)(void*, size_t), void* arg) {
  const auto* ctx = static_cast<const Ort::KernelContext*>(pool);
  // ORT cuts [0, total) into one static batch per thread. Its tasks here
  // claim the items from a shared counter instead, so a thread that falls
  // behind (another process on its core, slower pages) leaves its share to
  // the others; a task that finds the counter spent returns at once.
  struct Claim {
    std::atomic<size_t> next{0};
    size_t n;
    void (*fn)(void*, size_t);
    void* arg;
  } claim;
  claim.n = n;
  claim.fn = fn;
  claim.arg = arg;
  auto task = [](void* a, size_t) {
    auto* c = static_cast<Claim*>(a);
    for (size_t i = c->next.fetch_add(1, std::memory_order_relaxed); i < c->n;
         i = c->next.fetch_add(1, std::memory_order_relaxed))
      c->fn(c->arg, i);
  };
  ctx->ParallelFor(task, n, 0, &claim);
}

}  // namespace

hinamoe::Parallel ort_parallel(const Ort::KernelContext& ctx) {
  hinamoe::Parallel par;
  par.run = ort_parallel_for;
  par.pool = const_cast<Ort::KernelContext*>(&ctx);
  // Read once: glibc answers hardware_concurrency() by opening
  // /sys/devices/system/cpu/online, a few syscalls a node at every run.
  static const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  par.threads = threads;
  return par;
}

std::string k_exceeds_static_experts(const Ort::ConstKernelInfo& ki, int64_t k) {
  if (ki.GetInputCount() < 2) return "";
  const std::vector<int64_t> router = ki.GetInputTypeInfo(1).GetTensorTypeAndShapeInfo().GetShape();
  if (router.size() == 2 && router[1] > 0 && k > router[1])
    return "attribute k=" + std::to_string(k) + " exceeds the number of experts (" + std::to_string(router[1]) + ")";
  return "";
}

}  // namespace hinamoe_ep
