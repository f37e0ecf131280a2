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
 * When GPUM_SIM_NVML is unset, the machine is described by the simulation's JSON file instead
 * ($GPUM_SIM_CONFIG, default /etc/gpum-sim/gpu.json, see tests/sim/gpu.json), re-read at every
 * nvmlInit so a test can change the machine under a running agent:
 *   {"state":"ok","gpus":2,"model":"NVIDIA H100 80GB HBM3 (SIMULATED)","driver":"550.90.07"}
 * A missing file means state "ok", 1 GPU. The test host installs this library as
 * /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1, the name preflight loads by default.
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

/* The JSON file's values, read by load_config(). */
static char cfg_state[64] = "ok";
static char cfg_model[96] = "Tesla T4 (simulated)";
static char cfg_driver[32] = "550.127.05";
static unsigned cfg_gpus = 1;

/* Copies the value of "key" in the flat JSON object `json` (a string or a number) into out. */
static int json_field(const char *json, const char *key, char *out, size_t len) {
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(json, pat);
    if (!p) return 0;
    p += strlen(pat);
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == ':') p++;
    int quoted = *p == '"';
    if (quoted) p++;
    size_t i = 0;
    while (*p && i + 1 < len && (quoted ? *p != '"' : (*p != ',' && *p != '}' && *p != ' ' && *p != '\n'))) {
        out[i++] = *p++;
    }
    out[i] = 0;
    return i > 0;
}

static void load_config(void) {
    const char *path = getenv("GPUM_SIM_CONFIG");
    if (!path || !*path) path = "/etc/gpum-sim/gpu.json";
    FILE *f = fopen(path, "r");
    if (!f) return;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char num[16];
    json_field(buf, "state", cfg_state, sizeof cfg_state);
    json_field(buf, "model", cfg_model, sizeof cfg_model);
    json_field(buf, "driver", cfg_driver, sizeof cfg_driver);
    if (json_field(buf, "gpus", num, sizeof num)) cfg_gpus = (unsigned)atoi(num);
}

static int from_env(void) {
    const char *m = getenv("GPUM_SIM_NVML");
    return m && *m;
}

static const char *mode(void) {
    return from_env() ? getenv("GPUM_SIM_NVML") : cfg_state;
}

static unsigned gpu_count(void) {
    if (strcmp(mode(), "no_devices") == 0) return 0;
    unsigned c = cfg_gpus;
    if (from_env()) {
        const char *n = getenv("GPUM_SIM_NVML_GPUS");
        c = n ? (unsigned)atoi(n) : 1;
    }
    return c > 8 ? 8 : c;
}

static const char *model(void) {
    return from_env() ? "Tesla T4 (simulated)" : cfg_model;
}

static const char *driver(void) {
    return from_env() ? "550.127.05" : cfg_driver;
}

nvmlReturn_t nvmlInit_v2(void) {
    if (!from_env()) load_config();
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
    return put(version, length, driver());
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
    return put(name, length, model());
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = 12040;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    char s[80];
    /* Stable per index, so "this GPU is already registered" can be simulated across hosts. */
    snprintf(s, sizeof s, "GPU-5a1e0000-0000-4000-8000-%012u", device->index);
    return put(uuid, length, s);
}

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *mem) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || !mem) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long mib = strstr(model(), "80GB") ? 81559ULL : 15360ULL;
    mem->total = mib << 20;
    mem->used = 0;
    mem->free = mem->total;
    return NVML_SUCCESS;
}
