/* A driver that costs nothing: the NVML C functions powerbudgetd calls, answered from a
 * few numbers in memory, so that a daemon run over it spends CPU only on itself.
 *
 * Built by nulldriver.py (beside this file) as libnvidia-ml.so.1 and found by
 * the real bindings through LD_LIBRARY_PATH, exactly as the driver's library would be:
 * no Python callback, no simulated physics, no lock. Not a simulator: the draw is a
 * square wave per card (busy 2 s, idle 3 s, the cards out of phase), capped at the
 * enforced limit, and a written limit is in force at once. Prototypes from nvml.h.
 *
 * NULLNVML_CARDS: how many cards (default 8, 1 to 1024; nvmlInit refuses anything else).
 * Each is a 700 W card with a 200 W floor (the H200's constraints, as measured). Limits
 * and energy last from the first nvmlInit to the end of the process, as the driver's do.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct nvml_card *nvmlDevice_t;

enum { OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6, INSUFFICIENT_SIZE = 7 };
enum { MAX_CARDS = 1024, MIN_MW = 200000, MAX_MW = 700000, IDLE_MW = 90000, BUSY_MW = 650000 };
enum { PERIOD_S = 5, BUSY_S = 2 };  /* the square wave: busy the first 2 s of every 5 */

struct nvml_card {
    unsigned index;
    unsigned limit_mw;  /* written on one NVML worker, read on others: atomics */
    double energy_mj;   /* up to energy_at, under energy_lock */
    double energy_at;
    char uuid[64];
};

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

static struct nvml_card cards[MAX_CARDS];
static unsigned ncards;
static double started;
static pthread_mutex_t energy_lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;  /* limits and energy live from the first nvmlInit to the process's end, as the driver's */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int valid(nvmlDevice_t d) {
    uintptr_t p = (uintptr_t)d, lo = (uintptr_t)cards;
    return initialised && p >= lo && p < lo + ncards * sizeof cards[0] && (p - lo) % sizeof cards[0] == 0;
}

static unsigned limit_of(nvmlDevice_t d) { return __atomic_load_n(&d->limit_mw, __ATOMIC_RELAXED); }

static unsigned draw_mw(nvmlDevice_t d) {
    double phase = now_s() - started + d->index * 1.3;
    unsigned want = (long long)phase % PERIOD_S < BUSY_S ? BUSY_MW : IDLE_MW, limit = limit_of(d);
    return want < limit ? want : limit;
}

/* mJ drawn since init: the draw at each reading held since the one before (monotonic;
 * read from several threads: the NVML workers, a metrics scrape). */
static unsigned long long energy(nvmlDevice_t d) {
    pthread_mutex_lock(&energy_lock);
    double t = now_s();
    d->energy_mj += (t - d->energy_at) * draw_mw(d);
    d->energy_at = t;
    unsigned long long mj = (unsigned long long)d->energy_mj;
    pthread_mutex_unlock(&energy_lock);
    return mj;
}

static nvmlReturn_t init(void) {
    if (initialised) return OK;
    const char *n = getenv("NULLNVML_CARDS");
    long want = n ? strtol(n, NULL, 10) : 8;
    if (want < 1 || want > MAX_CARDS) return INVALID_ARGUMENT;  /* nulldriver.environ checks it first */
    ncards = (unsigned)want;
    started = now_s();
    for (unsigned i = 0; i < ncards; i++) {
        cards[i].index = i;
        cards[i].limit_mw = MAX_MW;
        cards[i].energy_at = started;
        snprintf(cards[i].uuid, sizeof cards[i].uuid, "GPU-00000000-0000-4000-8000-%012u", i);
    }
    initialised = 1;
    return OK;
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return init(); }
nvmlReturn_t nvmlInit_v2(void) { return init(); }
nvmlReturn_t nvmlShutdown(void) { return initialised ? OK : UNINITIALIZED; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {  /* nvml.h's wording, which the bindings put in their exceptions */
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case INVALID_ARGUMENT: return "Invalid Argument";
    case NOT_SUPPORTED: return "Not Supported";
    case NOT_FOUND: return "Not Found";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t text(char *out, unsigned len, const char *s) {
    if (strlen(s) + 1 > len) return INSUFFICIENT_SIZE;
    strcpy(out, s);
    return OK;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned len) { return text(v, len, "0.0.null"); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) { return initialised ? (*n = ncards, OK) : UNINITIALIZED; }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (!initialised) return UNINITIALIZED;
    if (i >= ncards) return INVALID_ARGUMENT;
    *d = &cards[i];
    return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
    if (!initialised) return UNINITIALIZED;
    for (unsigned i = 0; i < ncards; i++)
        if (strcmp(cards[i].uuid, uuid) == 0) { *d = &cards[i]; return OK; }
    return NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *u, unsigned len) {
    return valid(d) ? text(u, len, d->uuid) : INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *n, unsigned len) {
    return valid(d) ? text(n, len, "null driver card") : INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t d, unsigned *lo, unsigned *hi) {
    if (!valid(d)) return INVALID_ARGUMENT;
    *lo = MIN_MW, *hi = MAX_MW;
    return OK;
}

static nvmlReturn_t out_uint(nvmlDevice_t d, unsigned *out, unsigned v) {
    if (!valid(d)) return INVALID_ARGUMENT;
    *out = v;
    return OK;
}

nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t d, unsigned *mw) { return out_uint(d, mw, MAX_MW); }
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned *mw) { return out_uint(d, mw, valid(d) ? limit_of(d) : 0); }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned *mw) { return out_uint(d, mw, valid(d) ? limit_of(d) : 0); }
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned *mw) { return out_uint(d, mw, valid(d) ? draw_mw(d) : 0); }

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    if (!valid(d)) return INVALID_ARGUMENT;
    *mj = energy(d);
    return OK;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    if (!valid(d) || count < 0) return INVALID_ARGUMENT;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)(now_s() * 1e6), v->latencyUsec = 0, v->valueType = 1;
        v->nvmlReturn = OK;
        switch (v->fieldId) {
        case 185: case 186: v->value.uiVal = draw_mw(d); break;                /* average, instant */
        case 190: case 192: v->value.uiVal = limit_of(d); break;               /* enforced, requested */
        default: v->nvmlReturn = NOT_SUPPORTED;
        }
    }
    return OK;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *mode) { return valid(d) ? (*mode = 1, OK) : INVALID_ARGUMENT; }
nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t d, int mode) { (void)mode; return valid(d) ? OK : INVALID_ARGUMENT; }

nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t d, unsigned mw) {
    if (!valid(d) || mw < MIN_MW || mw > MAX_MW) return INVALID_ARGUMENT;
    __atomic_store_n(&d->limit_mw, mw, __ATOMIC_RELAXED);
    return OK;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned *cur, unsigned *pending) { (void)d; (void)cur; (void)pending; return NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned *is) { return out_uint(d, is, 0); }
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned *n) { (void)d; (void)n; return NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned i, nvmlDevice_t *m) { (void)d; (void)i; (void)m; return NOT_SUPPORTED; }
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *p) { (void)d; (void)p; return INVALID_ARGUMENT; }
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) {
    if (!valid(d)) return INVALID_ARGUMENT;
    *r = draw_mw(d) >= limit_of(d) ? 0x4 : 0;  /* SW power cap while at the limit */
    return OK;
}
