// Thread-block cluster capacity on this GPU (an H100/H200 diagnostic for the NVFP4 wgmma rows' in-cluster K split:
// vllm_blockfp8/csrc/fp4/sm90/w4a16_wgmma.cu counts "slots" with the same query).
//
// Question: a cluster's CTAs must share one GPC, so clusters of s CTAs at B CTAs per SM fill fewer than B x SMs slots
// when a GPC's slots do not divide by s. How many CTAs run at once for each (B, s)? The answer is
// cudaOccupancyMaxActiveClusters x s for a 256-thread kernel whose dynamic shared memory allows exactly B CTAs per SM
// (B = 1, 2, 3: the wgmma rows' 128x256, 128x64 / 128x128, 128x32 tiles), s = 1..16 (above 8 non-portable).
//
// Build and run (~5 s after nvcc):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a dev/probes/cluster_slots_probe.cu -o probe && ./probe
#include <cuda_runtime.h>

#include <cstdio>

__global__ void __launch_bounds__(256) occupy(int* out) {
  extern __shared__ int smem[];
  if (threadIdx.x == 0 && out != nullptr) out[blockIdx.x] = smem[0];
}

int main() {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const int per_sm = int(prop.sharedMemPerMultiprocessor), per_block = int(prop.sharedMemPerBlockOptin);
  std::printf("%s: %d SMs, %d KB shared memory per SM\n", prop.name, prop.multiProcessorCount, per_sm / 1024);
  cudaFuncSetAttribute(occupy, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  std::printf("CTAs/SM  slots(B x SMs)  CTAs at once in clusters of s = 1..16\n");
  for (int b = 1; b <= 3; ++b) {
    int smem = per_sm / b - 2048;
    if (smem > per_block) smem = per_block;
    cudaFuncSetAttribute(occupy, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, occupy, 256, smem);
    std::printf("%7d  %14d ", blocks, blocks * prop.multiProcessorCount);
    for (int s = 1; s <= 16; ++s) {
      cudaLaunchConfig_t c = {};
      cudaLaunchAttribute cluster;
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = unsigned(s);
      c.gridDim = dim3(1, 1, unsigned(s));
      c.blockDim = dim3(256);
      c.dynamicSmemBytes = size_t(smem);
      c.attrs = &cluster;
      c.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, occupy, &c) != cudaSuccess) clusters = 0, cudaGetLastError();
      std::printf(" %4d", clusters * s);
    }
    std::printf("\n");
  }
  return 0;
}
