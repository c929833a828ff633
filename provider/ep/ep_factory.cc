#include "ep_factory.h"

#include <memory>

#include "ep.h"
#include "kernel_registry.h"
#include "kernels/tier.h"

namespace hinamoe_ep {

HinaEpFactory::HinaEpFactory(const OrtApi& api, const OrtLogger& logger)
    : OrtEpFactory{}, api_(api), ep_api_(*api.GetEpApi()), logger_(logger) {
  ort_version_supported = kApiVersion;
  GetName = GetNameImpl;
  GetVendor = GetVendorImpl;
  GetVendorId = GetVendorIdImpl;
  GetVersion = GetVersionImpl;
  GetSupportedDevices = GetSupportedDevicesImpl;
  CreateEp = CreateEpImpl;
  ReleaseEp = ReleaseEpImpl;
  ValidateCompiledModelCompatibilityInfo = ValidateCompiledModelCompatibilityInfoImpl;
  CreateAllocator = CreateAllocatorImpl;
  ReleaseAllocator = ReleaseAllocatorImpl;
  CreateDataTransfer = CreateDataTransferImpl;
  IsStreamAware = IsStreamAwareImpl;
  CreateSyncStreamForDevice = CreateSyncStreamForDeviceImpl;
  GetNumCustomOpDomains = GetNumCustomOpDomainsImpl;
  GetCustomOpDomains = GetCustomOpDomainsImpl;
  // The remaining callbacks (graphics interop, resource import, model
  // candidates, device incompatibility details) are optional: null means
  // "not supported" / "compatible".
}

HinaEpFactory::~HinaEpFactory() {
  if (registry_ != nullptr) ep_api_.ReleaseKernelRegistry(registry_);
}

OrtStatus* HinaEpFactory::kernel_registry(const OrtKernelRegistry** out) {
  std::lock_guard<std::mutex> lock(registry_mutex_);
  if (registry_ == nullptr) HINA_RETURN_IF_ERROR(create_kernel_registry(kEpName, &registry_));
  *out = registry_;
  return nullptr;
}

const char* ORT_API_CALL HinaEpFactory::GetNameImpl(const OrtEpFactory*) noexcept { return kEpName; }
const char* ORT_API_CALL HinaEpFactory::GetVendorImpl(const OrtEpFactory*) noexcept { return kVendor; }
uint32_t ORT_API_CALL HinaEpFactory::GetVendorIdImpl(const OrtEpFactory*) noexcept { return 0; }
const char* ORT_API_CALL HinaEpFactory::GetVersionImpl(const OrtEpFactory*) noexcept { return HINAMOE_VERSION; }

OrtStatus* ORT_API_CALL HinaEpFactory::GetSupportedDevicesImpl(OrtEpFactory* this_ptr,
                                                               const OrtHardwareDevice* const* devices,
                                                               size_t num_devices, OrtEpDevice** ep_devices,
                                                               size_t max_ep_devices,
                                                               size_t* num_ep_devices) noexcept {
  auto* f = static_cast<HinaEpFactory*>(this_ptr);
  *num_ep_devices = 0;
  HINA_API_BEGIN
  for (size_t i = 0; i < num_devices && *num_ep_devices < max_ep_devices; ++i) {
    if (f->api_.HardwareDevice_Type(devices[i]) != OrtHardwareDeviceType_CPU) continue;
    // Metadata shown by ort.get_ep_devices(): which kernel tier "auto" picks here.
    Ort::KeyValuePairs metadata;
    std::string err;
    const hinamoe::KernelTier* best = hinamoe::select_tier("auto", &err);
    metadata.Add("isa", best ? best->name : "none");
    std::string tiers;
    for (const auto& t : hinamoe::supported_tiers()) tiers += (tiers.empty() ? "" : ",") + t;
    metadata.Add("supported_isa", tiers.c_str());
    OrtEpDevice* ep_device = nullptr;
    HINA_RETURN_IF_ERROR(f->ep_api_.CreateEpDevice(f, devices[i], metadata, nullptr, &ep_device));
    ep_devices[(*num_ep_devices)++] = ep_device;
  }
  return nullptr;
  HINA_API_END
}

OrtStatus* ORT_API_CALL HinaEpFactory::CreateEpImpl(OrtEpFactory* this_ptr, const OrtHardwareDevice* const*,
                                                    const OrtKeyValuePairs* const*, size_t num_devices,
                                                    const OrtSessionOptions* session_options,
                                                    const OrtLogger* logger, OrtEp** ep) noexcept {
  auto* f = static_cast<HinaEpFactory*>(this_ptr);
  *ep = nullptr;
  HINA_API_BEGIN
  if (num_devices != 1) {
    return make_status(ORT_INVALID_ARGUMENT, "HinaMoE: expected exactly one CPU device, got " +
                                                 std::to_string(num_devices));
  }
  HinaEp::Options options;
  HINA_RETURN_IF_ERROR(HinaEp::read_options(f->api_, session_options, &options));
  *ep = new HinaEp(*f, options, *logger);
  return nullptr;
  HINA_API_END
}

void ORT_API_CALL HinaEpFactory::ReleaseEpImpl(OrtEpFactory*, OrtEp* ep) noexcept {
  delete static_cast<HinaEp*>(ep);
}

OrtStatus* ORT_API_CALL HinaEpFactory::ValidateCompiledModelCompatibilityInfoImpl(
    OrtEpFactory*, const OrtHardwareDevice* const*, size_t, const char*, OrtCompiledModelCompatibility* out) noexcept {
  *out = OrtCompiledModelCompatibility_EP_NOT_APPLICABLE;  // we never compile models
  return nullptr;
}

OrtStatus* ORT_API_CALL HinaEpFactory::CreateAllocatorImpl(OrtEpFactory*, const OrtMemoryInfo*,
                                                           const OrtKeyValuePairs*, OrtAllocator** allocator) noexcept {
  *allocator = nullptr;  // plain CPU memory: ORT's default allocator
  return nullptr;
}

void ORT_API_CALL HinaEpFactory::ReleaseAllocatorImpl(OrtEpFactory*, OrtAllocator*) noexcept {}

OrtStatus* ORT_API_CALL HinaEpFactory::CreateDataTransferImpl(OrtEpFactory*, OrtDataTransferImpl** out) noexcept {
  *out = nullptr;  // CPU only: nothing to copy between devices
  return nullptr;
}

bool ORT_API_CALL HinaEpFactory::IsStreamAwareImpl(const OrtEpFactory*) noexcept { return false; }

OrtStatus* ORT_API_CALL HinaEpFactory::CreateSyncStreamForDeviceImpl(OrtEpFactory*, const OrtMemoryDevice*,
                                                                     const OrtKeyValuePairs*,
                                                                     OrtSyncStreamImpl** stream) noexcept {
  *stream = nullptr;
  return nullptr;
}

OrtStatus* ORT_API_CALL HinaEpFactory::GetNumCustomOpDomainsImpl(OrtEpFactory*, size_t* num) noexcept {
  *num = 0;  // we run com.microsoft ops, whose schemas ORT already has
  return nullptr;
}

OrtStatus* ORT_API_CALL HinaEpFactory::GetCustomOpDomainsImpl(OrtEpFactory*, OrtCustomOpDomain**, size_t) noexcept {
  return nullptr;
}

}  // namespace hinamoe_ep
