#pragma once
// A GPU's energy counter through NVML, loaded at run time (libnvidia-ml.so.1 comes with the driver,
// not the toolkit: no link-time dependency, and machines without it simply report no energy).
#include <memory>
#include <string>

namespace twell::model {

class NvmlEnergy {
 public:
  // The device with this PCI bus id (cudaDeviceGetPCIBusId's form); unavailable() says why not.
  explicit NvmlEnergy(const std::string& pci_bus_id);
  ~NvmlEnergy();
  NvmlEnergy(const NvmlEnergy&) = delete;
  NvmlEnergy& operator=(const NvmlEnergy&) = delete;
  // Joules since the driver loaded (monotonic; NVML updates it every few tens of ms); −1 if unavailable.
  double joules() const;
  const std::string& unavailable() const noexcept { return why_; }

 private:
  struct Api;
  std::unique_ptr<Api> api_;
  void* device_ = nullptr;
  std::string why_;
};

}  // namespace twell::model
