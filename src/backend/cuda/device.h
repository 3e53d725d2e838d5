// CUDA device discovery. Implemented in device.cu when built with CUDA, in device_stub.cpp otherwise.
#pragma once
#include <cstddef>
#include <string>

namespace nlp {

bool cuda_compiled();  // built with the CUDA backend
// Number of usable CUDA devices; 0 when none (no driver, no device). Never throws.
int cuda_device_count(std::string* why_none = nullptr);
// "NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90" for device `index`.
std::string cuda_device_description(int index);
// Free and total memory of device `index` (cudaMemGetInfo); false when it cannot be asked.
bool cuda_mem_info(int index, size_t* free_bytes, size_t* total_bytes);

}  // namespace nlp
