// The library's only exported symbols (see exports.map).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "ep_factory.h"

extern "C" {

__attribute__((visibility("default"))) OrtStatus* CreateEpFactories(const char* /*registered_name*/,
                                                                    const OrtApiBase* api_base,
                                                                    const OrtLogger* default_logger,
                                                                    OrtEpFactory** factories, size_t max_factories,
                                                                    size_t* num_factories) {
  *num_factories = 0;
  // Ask for the API we were built against (29); ORT >= 1.29 provides it.
  const OrtApi* api = api_base->GetApi(hinamoe_ep::kApiVersion);
  if (api == nullptr) return nullptr;  // too old a runtime: no status API to report with
  Ort::InitApi(api);
  if (max_factories < 1) {
    return api->CreateStatus(ORT_INVALID_ARGUMENT, "HinaMoE: no room for the EP factory");
  }
  // A new factory per call: ORT owns it until ReleaseEpFactory.
  factories[0] = new hinamoe_ep::HinaEpFactory(*api, *default_logger);
  *num_factories = 1;
  return nullptr;
}

__attribute__((visibility("default"))) OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  delete static_cast<hinamoe_ep::HinaEpFactory*>(factory);
  return nullptr;
}

}  // extern "C"
