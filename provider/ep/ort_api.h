// The one place that includes ONNX Runtime's headers. The API table is set
// from the OrtApiBase handed to CreateEpFactories (ORT_API_MANUAL_INIT), so
// the library never links libonnxruntime.
#pragma once

#ifndef ORT_API_MANUAL_INIT
#define ORT_API_MANUAL_INIT
#endif
#include "onnxruntime_cxx_api.h"

#include <string>

namespace hinamoe_ep {

// The API version we are compiled against; the runtime may be newer.
constexpr uint32_t kApiVersion = ORT_API_VERSION;

inline OrtStatus* make_status(OrtErrorCode code, const std::string& msg) {
  return Ort::GetApi().CreateStatus(code, msg.c_str());
}

}  // namespace hinamoe_ep

// Return early with the status of an ORT C call when it failed.
#define HINA_RETURN_IF_ERROR(expr)          \
  do {                                      \
    OrtStatus* _hina_status = (expr);       \
    if (_hina_status != nullptr) return _hina_status; \
  } while (0)

// Turn C++ exceptions into an OrtStatus at API boundaries (callbacks are noexcept).
// ORT_FAIL, not ORT_EP_FAIL: the latter makes the Python API silently re-run on the CPU EP.
#define HINA_API_BEGIN try {
#define HINA_API_END                                                        \
  }                                                                         \
  catch (const Ort::Exception& ex) {                                        \
    return Ort::Status(ex).release();                                       \
  }                                                                         \
  catch (const std::exception& ex) {                                        \
    return hinamoe_ep::make_status(ORT_FAIL, ex.what());                 \
  }                                                                         \
  catch (...) {                                                             \
    return hinamoe_ep::make_status(ORT_FAIL, "HinaMoE: unknown exception"); \
  }
