// The EP factory: tells ORT which devices HinaMoE runs on (the CPU) and
// creates one HinaEp per session.
#pragma once

#include <mutex>
#include <string>

#include "ort_api.h"

namespace hinamoe_ep {

constexpr const char* kEpName = "HinaMoE";
constexpr const char* kVendor = "HinaMoE";

class HinaEpFactory : public OrtEpFactory {
 public:
  HinaEpFactory(const OrtApi& api, const OrtLogger& logger);
  ~HinaEpFactory();

  const OrtApi& api() const { return api_; }
  const OrtEpApi& ep_api() const { return ep_api_; }
  // The kernel registry, built on first use and shared by every HinaEp.
  OrtStatus* kernel_registry(const OrtKernelRegistry** out);

 private:
  static const char* ORT_API_CALL GetNameImpl(const OrtEpFactory*) noexcept;
  static const char* ORT_API_CALL GetVendorImpl(const OrtEpFactory*) noexcept;
  static uint32_t ORT_API_CALL GetVendorIdImpl(const OrtEpFactory*) noexcept;
  static const char* ORT_API_CALL GetVersionImpl(const OrtEpFactory*) noexcept;
  static OrtStatus* ORT_API_CALL GetSupportedDevicesImpl(OrtEpFactory*, const OrtHardwareDevice* const* devices,
                                                         size_t num_devices, OrtEpDevice** ep_devices,
                                                         size_t max_ep_devices, size_t* num_ep_devices) noexcept;
  static OrtStatus* ORT_API_CALL CreateEpImpl(OrtEpFactory*, const OrtHardwareDevice* const* devices,
                                              const OrtKeyValuePairs* const* ep_metadata, size_t num_devices,
                                              const OrtSessionOptions* session_options, const OrtLogger* logger,
                                              OrtEp** ep) noexcept;
  static void ORT_API_CALL ReleaseEpImpl(OrtEpFactory*, OrtEp* ep) noexcept;
  static OrtStatus* ORT_API_CALL ValidateCompiledModelCompatibilityInfoImpl(
      OrtEpFactory*, const OrtHardwareDevice* const* devices, size_t num_devices, const char* info,
      OrtCompiledModelCompatibility* out) noexcept;
  static OrtStatus* ORT_API_CALL CreateAllocatorImpl(OrtEpFactory*, const OrtMemoryInfo*, const OrtKeyValuePairs*,
                                                     OrtAllocator** allocator) noexcept;
  static void ORT_API_CALL ReleaseAllocatorImpl(OrtEpFactory*, OrtAllocator*) noexcept;
  static OrtStatus* ORT_API_CALL CreateDataTransferImpl(OrtEpFactory*, OrtDataTransferImpl** out) noexcept;
  static bool ORT_API_CALL IsStreamAwareImpl(const OrtEpFactory*) noexcept;
  static OrtStatus* ORT_API_CALL CreateSyncStreamForDeviceImpl(OrtEpFactory*, const OrtMemoryDevice*,
                                                               const OrtKeyValuePairs*,
                                                               OrtSyncStreamImpl** stream) noexcept;
  static OrtStatus* ORT_API_CALL GetNumCustomOpDomainsImpl(OrtEpFactory*, size_t* num) noexcept;
  static OrtStatus* ORT_API_CALL GetCustomOpDomainsImpl(OrtEpFactory*, OrtCustomOpDomain** domains,
                                                        size_t num) noexcept;

  const OrtApi& api_;
  const OrtEpApi& ep_api_;
  const OrtLogger& logger_;
  std::mutex registry_mutex_;
  OrtKernelRegistry* registry_ = nullptr;
};

}  // namespace hinamoe_ep
