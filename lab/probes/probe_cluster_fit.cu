// twell_probe_cluster_fit: how many thread-block clusters of a size fit the GPU at once, by the
// CTA's dynamic shared memory (cudaOccupancyMaxActiveClusters: the hardware's GPC layout, no
// launch). For a cluster-a-head decode kernel (docs/runtime.md, plan step 3, "What batch 1 has
// left"): the 2B's 32 heads need 32 clusters resident together, or a second wave of them runs after
// the first. It says what fits an idle GPU; under a programmatic launch the previous kernel's CTAs
// still hold SM resources, which it does not model.
//   twell_probe_cluster_fit [threads]   (default 256)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace {

#define CK(x)                                                                                  \
  do {                                                                                         \
    const cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// Never launched: the occupancy query only reads its attributes.
__global__ void cluster_kernel(int* out) {
  extern __shared__ int smem[];
  if (out) out[blockIdx.x] = smem[threadIdx.x];
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 256;
  if (threads < 32 || threads > 1024 || threads % 32 != 0) {
    std::fprintf(stderr, "usage: twell_probe_cluster_fit [threads: a multiple of 32, 32-1024]\n");
    return 2;
  }
  int dev = 0, sms = 0, optin = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  CK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  std::printf("# Clusters resident at once, %s (%d SMs, %d KB opt-in shared memory a CTA), %d threads a CTA\n\n",
              prop.name, sms, optin / 1024, threads);
  const int kb[] = {0, 32, 64, 100, 113, 135, 165, 200, 227};
  std::printf("| cluster size |");
  for (const int k : kb) std::printf(" %d KB |", k);
  std::printf("\n|---:|");
  for (std::size_t i = 0; i < sizeof kb / sizeof kb[0]; ++i) std::printf("---:|");
  std::printf("\n");
  for (const int size : {1, 2, 4, 5, 8, 16}) {
    std::printf("| %d |", size);
    for (const int k : kb) {
      const std::size_t bytes = std::min<std::size_t>(static_cast<std::size_t>(k) * 1024, optin);
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(size * 64);
      cfg.blockDim = dim3(threads);
      cfg.dynamicSmemBytes = bytes;
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = size;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, cluster_kernel, &cfg);
      if (e != cudaSuccess) {
        cudaGetLastError();  // a size this GPU refuses: not sticky
        std::printf(" — |");
      } else {
        std::printf(" %d |", clusters);
      }
    }
    std::printf("\n");
  }
  std::printf("\n(— : the size is refused at that shared memory.)\n");
  return 0;
}
