/* The globals a pickle may name (GLOBAL / STACK_GLOBAL): what PyTorch 2.11's weights_only
 * unpickler (torch/_weights_only_unpickler.py, _get_allowed_globals) accepts by default, plus
 * the classes of DCP's `.metadata` and of its byte items, and argparse.Namespace. Anything else (os.system,
 * builtins.eval, ...) is refused by the parser where the global is created, so no code
 * downstream ever sees one. The reader never calls anything either way: the list only keeps
 * files PyTorch itself would refuse to load with weights_only=True from being accepted,
 * printed or converted. */
#include <string.h>

#include "ckpt/pickle.h"

/* module and the names allowed in it */
typedef struct allow_mod {
    const char *module;
    const char *const *names;
} allow_mod;

/* torch: the dtypes (str(torch.float32) == "torch.float32"), torch.Size/Tensor/device, the
 * legacy typed storages, the typed tensor classes and the quantization schemes */
static const char *const TORCH[] = {
    "Size", "Tensor", "device", "UntypedStorage", "TypedStorage",
    /* dtypes */
    "float32", "float64", "float16", "bfloat16", "complex32", "complex64", "complex128", "uint8", "uint16", "uint32",
    "uint64", "int8", "int16", "int32", "int64", "bool", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
    "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7",
    /* legacy storage classes */
    "FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage", "CharStorage", "ByteStorage", "ShortStorage",
    "IntStorage", "LongStorage", "BoolStorage", "ComplexFloatStorage", "ComplexDoubleStorage", "QUInt8Storage",
    "QInt8Storage", "QInt32Storage", "QUInt4x2Storage", "QUInt2x4Storage",
    /* typed tensor classes */
    "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "CharTensor", "ByteTensor", "ShortTensor",
    "IntTensor", "LongTensor", "BoolTensor",
    /* quantization schemes */
    "per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric",
    "per_channel_affine_float_qparams", NULL};
static const char *const TORCH_TENSOR_CLASSES[] = {"FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor",
                                                   "CharTensor",  "ByteTensor",   "ShortTensor", "IntTensor",
                                                   "LongTensor",  "BoolTensor",   NULL};
static const char *const TORCH_STORAGE[] = {"UntypedStorage", "TypedStorage", NULL};
static const char *const TORCH_UTILS[] = {"_rebuild_parameter",
                                          "_rebuild_parameter_with_state",
                                          "_rebuild_qtensor",
                                          "_rebuild_tensor",
                                          "_rebuild_tensor_v2",
                                          "_rebuild_tensor_v3",
                                          "_rebuild_sparse_tensor",
                                          "_rebuild_meta_tensor_no_storage",
                                          "_rebuild_wrapper_subclass",
                                          "_rebuild_device_tensor_from_numpy",
                                          "_rebuild_device_tensor_from_cpu_tensor",
                                          NULL};
static const char *const TORCH_TENSOR[] = {"_rebuild_from_type_v2", NULL};
static const char *const TORCH_PARAMETER[] = {"Parameter", NULL};
static const char *const TORCH_SERIALIZATION[] = {"_get_layout", NULL};
static const char *const COLLECTIONS[] = {"OrderedDict", "Counter", NULL};
static const char *const CODECS[] = {"encode", NULL};
static const char *const BUILTINS[] = {"bytearray", "set", "complex", NULL};
/* DCP: the .metadata classes (and their pre-2.2 home), the storage info, the checkpoint id
 * (a path) in StorageMeta, and the BytesIO wrapper of byte items */
static const char *const DCP_METADATA[] = {"Metadata",
                                           "TensorStorageMetadata",
                                           "BytesStorageMetadata",
                                           "ChunkStorageMetadata",
                                           "TensorProperties",
                                           "MetadataIndex",
                                           "StorageMeta",
                                           "_MEM_FORMAT_ENCODING",
                                           NULL};
static const char *const DCP_SHARDED_METADATA[] = {"TensorProperties", "MEM_FORMAT_ENCODING", NULL};
static const char *const DCP_FILESYSTEM[] = {"_StorageInfo", NULL};
static const char *const PATHLIB[] = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", NULL};
static const char *const IO[] = {"BytesIO", NULL};
/* training scripts' saved arguments (fairseq, older Lightning): a plain attribute container, built
 * from its state dict; listed in PyTorch's documentation of torch.serialization.add_safe_globals */
static const char *const ARGPARSE[] = {"Namespace", NULL};

/* DeepSpeed's *_optim_states.pt: classes that carry only data (never called here: a LossScaler's state dict
 * {cur_scale, dynamic}, the int of a ZeroStageEnum, a fragment_address's {numel, start}) */
static const char *const DS_LOSS_SCALER[] = {"LossScaler", "DynamicLossScaler", NULL};
static const char *const DS_ZERO_CONFIG[] = {"ZeroStageEnum", NULL};
static const char *const DS_FRAGMENT[] = {"fragment_address", NULL};

static const allow_mod ALLOWED[] = {
    {"torch", TORCH},
    {"torch.cuda", TORCH_TENSOR_CLASSES},
    {"torch.storage", TORCH_STORAGE},
    {"torch._utils", TORCH_UTILS},
    {"torch._tensor", TORCH_TENSOR},
    {"torch.nn.parameter", TORCH_PARAMETER},
    {"torch.serialization", TORCH_SERIALIZATION},
    {"collections", COLLECTIONS},
    {"_codecs", CODECS},
    {"builtins", BUILTINS},
    {"__builtin__", BUILTINS}, /* protocol-2 spelling, mapped to builtins by pickle */
    {"torch.distributed.checkpoint.metadata", DCP_METADATA},
    {"torch.distributed._shard.sharded_tensor.metadata", DCP_SHARDED_METADATA},
    {"torch.distributed.checkpoint.filesystem", DCP_FILESYSTEM},
    /* OLMo-core 3's writer pickles its own _StorageInfo: a dataclass of the same three fields
     * (relative_path, offset, length), read as torch's (layouts/lay_olmo_core.c) */
    {"olmo_core.distributed.checkpoint.filesystem", DCP_FILESYSTEM},
    {"pathlib", PATHLIB},
    {"_io", IO},
    {"io", IO},
    {"argparse", ARGPARSE},
    {"deepspeed.runtime.fp16.loss_scaler", DS_LOSS_SCALER},
    {"deepspeed.runtime.zero.config", DS_ZERO_CONFIG},
    {"deepspeed.utils.tensor_fragment", DS_FRAGMENT},
};

int pkl_global_allowed(const char *module, size_t module_len, const char *name, size_t name_len) {
    for (size_t i = 0; i < sizeof ALLOWED / sizeof *ALLOWED; i++) {
        const allow_mod *m = &ALLOWED[i];
        if (strlen(m->module) != module_len || memcmp(m->module, module, module_len)) continue;
        for (const char *const *n = m->names; *n; n++)
            if (strlen(*n) == name_len && !memcmp(*n, name, name_len)) return 1;
        return 0;
    }
    return 0;
}
