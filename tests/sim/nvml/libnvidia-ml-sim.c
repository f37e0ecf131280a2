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
 * Two more keys describe what runs on the GPUs (issue 33, the GPU check after a rental):
 *   "processes":"0:4242,1:77"   compute processes, as GPU-index:pid pairs (what a hung
 *                               workload leaves behind); "graphics" the same for graphics ones
 *   "lost":"1"                  GPUs (by index, comma-separated) that do not answer: every
 *                               call on them returns NVML_ERROR_GPU_IS_LOST
 * nvmlInit/nvmlShutdown count, as NVML's do: a process with two handles (the agent's inventory
 * and its GPU check) keeps the library initialized until the last one shuts down.
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
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
};

static struct sim_device devices[8];
static int lost(unsigned index);
static int initialized;

/* The JSON file's values, read by load_config(). */
static char cfg_state[64] = "ok";
static char cfg_model[96] = "Tesla T4 (simulated)";
static char cfg_driver[32] = "550.127.05";
static unsigned cfg_gpus = 1;
static char cfg_processes[1024] = "";
static char cfg_graphics[1024] = "";
static char cfg_lost[256] = "";

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
    cfg_processes[0] = cfg_graphics[0] = cfg_lost[0] = 0;
    json_field(buf, "processes", cfg_processes, sizeof cfg_processes);
    json_field(buf, "graphics", cfg_graphics, sizeof cfg_graphics);
    json_field(buf, "lost", cfg_lost, sizeof cfg_lost);
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
    initialized++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
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
    if (lost(device->index)) return NVML_ERROR_GPU_IS_LOST;
    unsigned long long mib = strstr(model(), "80GB") ? 81559ULL : 15360ULL;
    mem->total = mib << 20;
    mem->used = 0;
    mem->free = mem->total;
    return NVML_SUCCESS;
}

/* Whether GPU `index` is listed in "lost" (only from the JSON file). */
static int lost(unsigned index) {
    if (from_env()) return 0;
    for (const char *p = cfg_lost; *p;) {
        char *end;
        unsigned long i = strtoul(p, &end, 10);
        if (end == p) break;
        if (i == index) return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    const char *prefix = "GPU-5a1e0000-0000-4000-8000-";
    if (strncmp(uuid, prefix, strlen(prefix)) != 0) return NVML_ERROR_NOT_FOUND;
    const char *digits = uuid + strlen(prefix);
    if (strlen(digits) != 12 || strspn(digits, "0123456789") != 12) return NVML_ERROR_NOT_FOUND;
    unsigned long index = strtoul(digits, NULL, 10);
    if (index >= gpu_count()) return NVML_ERROR_NOT_FOUND;
    devices[index].index = (unsigned)index;
    *device = &devices[index];
    return NVML_SUCCESS;
}

/* nvmlProcessInfo_t as NVML 12 lays it out (nvml-wrapper-sys 0.8's nvmlProcessInfo_v2_st). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/* The processes of `list` ("index:pid,...") on GPU `index`, the way NVML's
 * nvmlDevice*RunningProcesses_v3 answers: the count alone when `infos` is NULL or too short. */
static nvmlReturn_t processes(const char *list, nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (lost(device->index)) return NVML_ERROR_GPU_IS_LOST;
    unsigned pids[64], n = 0;
    if (!from_env()) {
        for (const char *p = list; *p && n < 64;) {
            char *end;
            unsigned long gpu = strtoul(p, &end, 10);
            if (end == p || *end != ':') break;
            unsigned long pid = strtoul(end + 1, &end, 10);
            if (gpu == device->index) pids[n++] = (unsigned)pid;
            if (*end != ',') break;
            p = end + 1;
        }
    }
    if (!infos || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned i = 0; i < n; i++) {
        infos[i].pid = pids[i];
        infos[i].usedGpuMemory = 512ULL << 20;
        infos[i].gpuInstanceId = 0xFFFFFFFF;
        infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(cfg_processes, device, count, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
    return processes(cfg_graphics, device, count, infos);
}
