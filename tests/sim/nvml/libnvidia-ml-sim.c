/*
 * SIMULATION of NVIDIA's NVML library (libnvidia-ml.so.1), for tests on machines without a GPU.
 *
 * It is the only simulated layer in gpum's tests: the NVIDIA hardware/vendor boundary. It
 * exports the few NVML entry points gpum's preflight calls through nvml-wrapper, with NVML's
 * real return codes, so the real dlopen + symbol loading + error classification in
 * `gpum-preflight` run unchanged. Point gpum at it with GPUM_NVML_LIB=/path/to/this.so.
 *
 * The simulated state comes from the environment of the process that loads it:
 *   GPUM_SIM_NVML=ok|driver_not_loaded|mismatch|no_permission|no_devices   (default ok)
 *   GPUM_SIM_NVML_GPUS=N   number of simulated GPUs when ok (default 1)
 *
 * Build: cc -shared -fPIC -o libnvidia-ml-sim.so libnvidia-ml-sim.c
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct sim_device { unsigned index; } *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
};

static struct sim_device devices[8];
static int initialized;

static const char *mode(void) {
    const char *m = getenv("GPUM_SIM_NVML");
    return m && *m ? m : "ok";
}

static unsigned gpu_count(void) {
    if (strcmp(mode(), "no_devices") == 0) return 0;
    const char *n = getenv("GPUM_SIM_NVML_GPUS");
    unsigned c = n ? (unsigned)atoi(n) : 1;
    return c > 8 ? 8 : c;
}

nvmlReturn_t nvmlInit_v2(void) {
    const char *m = mode();
    if (strcmp(m, "driver_not_loaded") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    if (strcmp(m, "mismatch") == 0) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    if (strcmp(m, "no_permission") == 0) return NVML_ERROR_NO_PERMISSION;
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t put(char *buf, unsigned len, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, s);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    return put(version, length, "550.127.05");
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = gpu_count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
    devices[index].index = index;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    return put(name, length, "Tesla T4 (simulated)");
}
