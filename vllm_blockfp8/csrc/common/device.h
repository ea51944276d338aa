// The device facts the tile tables read (compute capability, SM count), queried once per device.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>

namespace blockfp8 {

struct DeviceFacts {
  int cc = 0;        // major * 10 + minor
  int sm_count = 0;  // multiprocessors
  int max_smem = 0;  // opt-in shared memory per block, bytes (the NVFP4 W4A16 rows check it)
};

// Cached per device (up to 64); the first query's error, if any, is returned and nothing is cached.
inline cudaError_t query_device(int device, DeviceFacts* out) {
  static std::mutex mu;
  static DeviceFacts cache[64] = {};
  std::lock_guard<std::mutex> lock(mu);
  DeviceFacts& f = cache[device & 63];
  if (f.sm_count == 0) {
    int major = 0, minor = 0, sms = 0, smem = 0;
    cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    f.cc = major * 10 + minor;
    f.sm_count = sms;
    f.max_smem = smem;
  }
  *out = f;
  return cudaSuccess;
}

}  // namespace blockfp8
