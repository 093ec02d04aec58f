#include "model/nvml_energy.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

namespace twell::model {

// The four NVML entry points used, by their documented C signatures (nvmlReturn_t is an int enum,
// 0 = NVML_SUCCESS; nvmlDevice_t an opaque pointer; energy in millijoules, Volta and newer).
struct NvmlEnergy::Api {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_pci)(const char*, void**) = nullptr;
  int (*energy)(void*, unsigned long long*) = nullptr;
};

NvmlEnergy::NvmlEnergy(const std::string& pci_bus_id) : api_(std::make_unique<Api>()) {
  api_->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!api_->lib) {
    why_ = "libnvidia-ml.so.1 not found";
    return;
  }
  auto sym = [&](const char* name) { return dlsym(api_->lib, name); };
  api_->init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  api_->shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  api_->by_pci = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  api_->energy = reinterpret_cast<int (*)(void*, unsigned long long*)>(sym("nvmlDeviceGetTotalEnergyConsumption"));
  if (!api_->init || !api_->shutdown || !api_->by_pci || !api_->energy) {
    why_ = "libnvidia-ml.so.1 lacks an entry point";
    return;
  }
  if (int rc = api_->init(); rc != 0) {
    why_ = fmt::format("nvmlInit failed ({})", rc);
    api_->init = nullptr;
    return;
  }
  unsigned long long mj = 0;
  if (int rc = api_->by_pci(pci_bus_id.c_str(), &device_); rc != 0) {
    why_ = fmt::format("NVML has no device at {} ({})", pci_bus_id, rc);
    device_ = nullptr;
  } else if (int rc2 = api_->energy(device_, &mj); rc2 != 0) {
    why_ = fmt::format("this GPU reports no energy counter ({})", rc2);
    device_ = nullptr;
  }
}

NvmlEnergy::~NvmlEnergy() {
  if (api_->init) api_->shutdown();
  if (api_->lib) dlclose(api_->lib);
}

double NvmlEnergy::joules() const {
  unsigned long long mj = 0;
  if (!device_ || api_->energy(device_, &mj) != 0) return -1;
  return static_cast<double>(mj) * 1e-3;
}

}  // namespace twell::model
