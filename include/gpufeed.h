/*
 * gpufeed C ABI: read a dataset's epochs from any framework.
 *
 * Link with libgpufeed_c.so (cargo build --release -p gpufeed-capi). Every function returns a
 * status (GPUFEED_OK = 0) unless it returns a value; on failure, gpufeed_last_error() gives the
 * message on this thread (file, sample and what was wrong) — the last failure's, as errno: a
 * call that succeeds does not clear it, so read it only after a failure. Null handles are errors, not
 * crashes. A batch keeps its memory alive until gpufeed_batch_free; a DLPack tensor made from
 * it keeps it alive until the tensor's deleter runs.
 *
 * Kept in step with capi/src/lib.rs by a test (tests/it/capi.rs): change both together.
 *
 * The structs grow without breaking programs built against an older header: each begins with
 * its struct_size, which the _default calls (macros passing the caller's sizeof) write and the
 * library reads. A library newer than the program's header keeps its defaults for the fields
 * the program does not know; an older one refuses a struct whose fields it does not know are
 * set (GPUFEED_ERR_UNSUPPORTED). Fields are only ever appended. A struct_size that is not a
 * multiple of the struct's alignment, or over 4096, is refused (GPUFEED_ERR_INVALID).
 *
 * A handle may not be used after it is freed (gpufeed_loader_close, gpufeed_batch_free): as in
 * C generally, that is undefined, not an error the library can report. A batch stays valid
 * after its loader is closed, until it is freed.
 */
#ifndef GPUFEED_H
#define GPUFEED_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPUFEED_OK 0
#define GPUFEED_ERR_INVALID 1
#define GPUFEED_ERR_NOT_FOUND 2
#define GPUFEED_ERR_IO 3
#define GPUFEED_ERR_UNSUPPORTED 4
#define GPUFEED_ERR_SAMPLE 5
#define GPUFEED_ERR_PANIC 6
/* A wait for a batch passed timeout_ms: the epoch stays usable, call next again to go on. */
#define GPUFEED_ERR_TIMEOUT 7

typedef struct gpufeed_loader gpufeed_loader;
typedef struct gpufeed_batch gpufeed_batch;

/* Options of gpufeed_loader_open; fill with gpufeed_options_default first (the loader settings'
 * defaults, as gpufeed_loader_settings and `gpufeed bench load --help` name them). The dataset options
 * (format ... stride) are named as the CLI's --format ... --stride and Python's keyword arguments
 * (`gpufeed inspect --help` documents each): NULL, or 0, keeps the default. */
typedef struct gpufeed_options {
    uint32_t struct_size; /* sizeof(gpufeed_options) of this header: gpufeed_options_default writes it */
    uint32_t batch_size;
    uint32_t order; /* 0 global, 1 shard-buffer, 2 block, 3 sequential (no shuffle: evaluation) */
    uint64_t seed;
    uint32_t rank;
    uint32_t world_size;
    int32_t device; /* -1: host memory; >= 0: that CUDA device */
    uint32_t prefetch;
    uint8_t drop_last; /* nonzero: last_batch drop (the familiar alias) */
    uint8_t verify;
    uint8_t last_batch; /* GPUFEED_LAST_BATCH_SHORT (default), _DROP or _PAD */
    const char* format; /* from here on: the dataset options (see above) */
    const char* payload;
    const char* label_ext;
    int64_t label_offset;
    const char* tfrecord_index;
    const char* tfrecord_payload;
    const char* tfrecord_label;
    uint8_t tfrecord_recover;
    const char* token_dtype;
    uint32_t seq_len;
    uint32_t stride;
    uint8_t strict; /* nonzero: refuse a dataset in which indexing found any problem */
    uint64_t memory_budget; /* bytes the arena may take; 0: the default (4 GiB) */
    uint64_t timeout_ms; /* limit on each wait in gpufeed_loader_next; 0: none (the default) */
    /* From here on, 0 keeps the default (which gpufeed_options_default writes). */
    uint32_t in_flight; /* read groups being read at once */
    uint32_t queue_depth; /* reads in flight in the engine */
    uint32_t shuffle_buffer; /* order shard-buffer: samples shuffled together (a window of the shard stream, read whole; rounded to whole batches, at least one) */
    uint32_t open_blocks; /* order block: blocks drawn from at a time */
    uint64_t block_bytes; /* order block: bytes of consecutive samples per block */
    uint32_t open_files_max; /* files kept open at most; 0: every file, within the fd limit */
    /* Remote datasets (s3://, gs://, az://, http(s)://), read through a node-wide cache: */
    const char* cache_dir; /* its directory; NULL: $GPUFEED_CACHE_DIR, else ~/.cache/gpufeed */
    uint64_t cache_limit; /* the most bytes it holds; 0: the last limit given, else 90% of free */
    uint64_t cache_extent; /* bytes fetched with one GET and cached; 0: 8 MiB */
} gpufeed_options;

/* last_batch: SHORT delivers every sample exactly once (the last batch may be short); DROP drops
 * the samples that do not fill a batch; PAD gives every rank the same number of samples by
 * repeating some, each flagged (gpufeed_batch_is_padding). */
#define GPUFEED_LAST_BATCH_SHORT 0
#define GPUFEED_LAST_BATCH_DROP 1
#define GPUFEED_LAST_BATCH_PAD 2

/* Decoded images (gpufeed_loader_decode_images: from the next gpufeed_loader_start_epoch on; an
 * epoch in progress goes on undecoded to its end); fill with gpufeed_images_default first. */
typedef struct gpufeed_images {
    uint32_t struct_size; /* sizeof(gpufeed_images) of this header: gpufeed_images_default writes it */
    uint32_t transform; /* 0 train (random resized crop + flip), 1 eval (resize + centre crop) */
    uint32_t size; /* output side in pixels */
    uint32_t dtype; /* 0 uint8, 1 float16, 2 bfloat16, 3 float32 */
    uint32_t layout; /* 0 NCHW, 1 NHWC */
    float mean[3]; /* per channel, 0-1 scale (float dtypes) */
    float std[3];
    uint32_t threads; /* decode threads; 0: the cores / LOCAL_WORLD_SIZE (or GPUFEED_DECODE_THREADS) */
    uint32_t resize; /* eval: shorter side before the crop; 0: size * 8 / 7 */
} gpufeed_images;

/* The current (or last) epoch's figures (gpufeed_loader_stats). consumer_wait_s is the time
 * spent in gpufeed_loader_next, split into storage (reads not done), copy (host -> device not
 * done), verify (checks on the consumer's thread), decode and other. */
typedef struct gpufeed_stats {
    uint32_t struct_size; /* sizeof(gpufeed_stats) of this header: gpufeed_loader_stats writes it */
    uint64_t batches;
    uint64_t samples;
    uint64_t sample_errors;
    uint64_t bytes_delivered;
    uint64_t bytes_read;
    uint64_t reads;
    double consumer_wait_s;
    double storage_s;
    double copy_s;
    double verify_s;
    double decode_s;
    double other_s;
    double io_thread_cpu_s;
    double consumer_cpu_s;
    double decode_cpu_s;
    double remote_s; /* of consumer_wait_s: reads that fetched from an object store */
} gpufeed_stats;

#ifndef DLPACK_VERSION
/* The subset of dlpack.h (v0.8) that gpufeed exports. */
typedef struct {
    int32_t device_type; /* 1 kDLCPU, 2 kDLCUDA */
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code; /* 0 kDLInt, 1 kDLUInt, 2 kDLFloat, 4 kDLBfloat */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void* data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;
#endif

const char* gpufeed_last_error(void);
int32_t gpufeed_options_default_sized(gpufeed_options* out, uint32_t struct_size);
#define gpufeed_options_default(out) gpufeed_options_default_sized((out), (uint32_t)sizeof *(out))
int32_t gpufeed_loader_open(const char* path, const gpufeed_options* opts, gpufeed_loader** out);
int32_t gpufeed_loader_open_paths(const char** paths, uint32_t n, const gpufeed_options* opts, gpufeed_loader** out);
const char* gpufeed_loader_dataset_options(const gpufeed_loader* l);
/* The loader settings in effect as JSON (names of gpufeed.LOADER_SETTINGS; text values, null
 * when unset); gpufeed_options_default fills the struct from that table, RANK and WORLD_SIZE
 * from the environment when set. */
const char* gpufeed_loader_settings(const gpufeed_loader* l);
/* The image settings in effect since gpufeed_loader_decode_images, as a JSON object of text
 * values (the names of gpufeed.IMAGE_SETTINGS); "" before. Valid until the next
 * gpufeed_loader_decode_images or gpufeed_loader_close. */
const char* gpufeed_loader_image_settings(const gpufeed_loader* l);
/* Reads and checks every sample of the dataset at path, as `gpufeed verify` does (only the
 * dataset options of opts are used; NULL: defaults): *samples checked, *bad found (either may be
 * NULL). GPUFEED_OK when none is bad; GPUFEED_ERR_SAMPLE when some are, the first one's message
 * (file, sample, what was wrong) and the count in gpufeed_last_error. */
int32_t gpufeed_verify(const char* path, const gpufeed_options* opts, uint64_t* samples, uint64_t* bad);
uint64_t gpufeed_loader_samples_per_epoch(const gpufeed_loader* l);
uint64_t gpufeed_loader_problems(const gpufeed_loader* l);
const char* gpufeed_loader_problem(const gpufeed_loader* l, uint64_t i);
uint32_t gpufeed_loader_batches(const gpufeed_loader* l);
uint64_t gpufeed_loader_samples(const gpufeed_loader* l);
int32_t gpufeed_loader_start_epoch(gpufeed_loader* l, uint64_t epoch, uint32_t start);
/* Resumes epoch on this loader's rank count after it stopped on others: stop i (oldest first, n
 * of them) had world_sizes[i] ranks, each of which had delivered batches[i] batches (lockstep
 * training stops them together). The new ranks' loaders deliver every sample the epoch still
 * owed exactly once between them (last_batch PAD or DROP: the same number of batches on each,
 * repeats flagged by gpufeed_batch_is_padding); this one from its batch start of that rest.
 * n = 0: as gpufeed_loader_start_epoch. gpufeed_loader_resumed_batches: that rest's batches. */
int32_t gpufeed_loader_start_epoch_resumed(gpufeed_loader* l, uint64_t epoch, const uint32_t* world_sizes, const uint32_t* batches, uint32_t n, uint32_t start);
int32_t gpufeed_loader_resumed_batches(const gpufeed_loader* l, uint64_t epoch, const uint32_t* world_sizes, const uint32_t* batches, uint32_t n, uint32_t* out);
int32_t gpufeed_loader_next(gpufeed_loader* l, gpufeed_batch** out);
void gpufeed_loader_close(gpufeed_loader* l);
uint32_t gpufeed_batch_len(const gpufeed_batch* b);
int32_t gpufeed_batch_sample(const gpufeed_batch* b, uint32_t i, const uint8_t** data, uint64_t* len);
int64_t gpufeed_batch_label(const gpufeed_batch* b, uint32_t i);
uint8_t gpufeed_batch_is_padding(const gpufeed_batch* b, uint32_t i);
uint32_t gpufeed_batch_sample_id(const gpufeed_batch* b, uint32_t i);
int32_t gpufeed_batch_sample_range(const gpufeed_batch* b, uint32_t i, uint64_t* offset, uint64_t* len);
int32_t gpufeed_batch_to_dlpack(const gpufeed_batch* b, DLManagedTensor** out);
int32_t gpufeed_loader_stats_sized(const gpufeed_loader* l, gpufeed_stats* out, uint32_t struct_size);
#define gpufeed_loader_stats(l, out) gpufeed_loader_stats_sized((l), (out), (uint32_t)sizeof *(out))
int32_t gpufeed_images_default_sized(gpufeed_images* out, uint32_t struct_size);
#define gpufeed_images_default(out) gpufeed_images_default_sized((out), (uint32_t)sizeof *(out))
int32_t gpufeed_loader_decode_images(gpufeed_loader* l, const gpufeed_images* spec);
void gpufeed_batch_free(gpufeed_batch* b);

#ifdef __cplusplus
}
#endif

#endif /* GPUFEED_H */
