# ONNX Runtime C/C++ headers: not in the repo and not in ORT's wheels.
# They come from the npm registry package com.github.asus4.onnxruntime@0.4.9
# (ORT 1.29 headers, API 29), verified by sha256 and cached outside the build
# tree. HINAMOE_ORT_INCLUDE_DIR (CMake variable or environment) overrides.
#
# Sets HINAMOE_ORT_INCLUDE_DIR to a directory holding onnxruntime_c_api.h.

set(_ort_pkg "com.github.asus4.onnxruntime")
set(_ort_ver "0.4.9")
set(_ort_sha256 "e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d")
set(_ort_hdr_subdir "package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers")

if(NOT HINAMOE_ORT_INCLUDE_DIR AND DEFINED ENV{HINAMOE_ORT_INCLUDE_DIR})
  set(HINAMOE_ORT_INCLUDE_DIR "$ENV{HINAMOE_ORT_INCLUDE_DIR}")
endif()

if(HINAMOE_ORT_INCLUDE_DIR)
  if(NOT EXISTS "${HINAMOE_ORT_INCLUDE_DIR}/onnxruntime_ep_c_api.h")
    message(FATAL_ERROR "HINAMOE_ORT_INCLUDE_DIR=${HINAMOE_ORT_INCLUDE_DIR} holds no onnxruntime_ep_c_api.h")
  endif()
  message(STATUS "ONNX Runtime headers (override): ${HINAMOE_ORT_INCLUDE_DIR}")
  return()
endif()

# Cache root: HINAMOE_CACHE_DIR, else XDG_CACHE_HOME/hinamoe, else ~/.cache/hinamoe.
if(DEFINED ENV{HINAMOE_CACHE_DIR})
  set(_cache_root "$ENV{HINAMOE_CACHE_DIR}")
elseif(DEFINED ENV{XDG_CACHE_HOME})
  set(_cache_root "$ENV{XDG_CACHE_HOME}/hinamoe")
else()
  set(_cache_root "$ENV{HOME}/.cache/hinamoe")
endif()
set(_cache_dir "${_cache_root}/ort-headers-${_ort_ver}-${_ort_sha256}")

if(NOT EXISTS "${_cache_dir}/onnxruntime_ep_c_api.h")
  find_program(NPM_EXECUTABLE npm)
  if(NOT NPM_EXECUTABLE)
    message(FATAL_ERROR
      "npm not found: it is needed to fetch the ONNX Runtime headers (${_ort_pkg}@${_ort_ver}) "
      "from the npm registry. Install Node.js/npm (Debian: apt-get install npm), or set "
      "HINAMOE_ORT_INCLUDE_DIR to a directory with onnxruntime_c_api.h and onnxruntime_ep_c_api.h.")
  endif()
  set(_dl "${CMAKE_BINARY_DIR}/_ort_headers_download")
  file(REMOVE_RECURSE "${_dl}")
  file(MAKE_DIRECTORY "${_dl}")
  message(STATUS "Fetching ONNX Runtime headers: npm pack ${_ort_pkg}@${_ort_ver}")
  execute_process(
    COMMAND "${NPM_EXECUTABLE}" pack "${_ort_pkg}@${_ort_ver}" --silent
    WORKING_DIRECTORY "${_dl}"
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  set(_tgz "${_dl}/${_ort_pkg}-${_ort_ver}.tgz")
  if(NOT _rc EQUAL 0 OR NOT EXISTS "${_tgz}")
    message(FATAL_ERROR "npm pack ${_ort_pkg}@${_ort_ver} failed (exit ${_rc}): ${_err}${_out}")
  endif()
  file(SHA256 "${_tgz}" _got)
  if(NOT _got STREQUAL _ort_sha256)
    message(FATAL_ERROR
      "sha256 mismatch for ${_ort_pkg}-${_ort_ver}.tgz: expected ${_ort_sha256}, got ${_got}. "
      "Refusing to build against unverified headers.")
  endif()
  file(ARCHIVE_EXTRACT INPUT "${_tgz}" DESTINATION "${_dl}/x" PATTERNS "${_ort_hdr_subdir}/*")
  if(NOT EXISTS "${_dl}/x/${_ort_hdr_subdir}/onnxruntime_ep_c_api.h")
    message(FATAL_ERROR "${_ort_pkg}-${_ort_ver}.tgz holds no ${_ort_hdr_subdir}/onnxruntime_ep_c_api.h")
  endif()
  # Copy into a temp dir then rename, so a half-written cache is never used.
  file(MAKE_DIRECTORY "${_cache_root}")
  set(_tmp "${_cache_dir}.tmp-${CMAKE_BINARY_DIR}")
  string(MD5 _tmp_hash "${_tmp}")
  set(_tmp "${_cache_dir}.tmp-${_tmp_hash}")
  file(REMOVE_RECURSE "${_tmp}")
  file(COPY "${_dl}/x/${_ort_hdr_subdir}/" DESTINATION "${_tmp}")
  file(REMOVE_RECURSE "${_cache_dir}")
  file(RENAME "${_tmp}" "${_cache_dir}")
  file(REMOVE_RECURSE "${_dl}")
endif()

set(HINAMOE_ORT_INCLUDE_DIR "${_cache_dir}")
message(STATUS "ONNX Runtime headers (npm ${_ort_pkg}@${_ort_ver}, cached): ${HINAMOE_ORT_INCLUDE_DIR}")
