"""The environment switches of nlptrain, tools/nlprun and the jobscripts: one table, rendered into
docs/configuration.md by tools/config_reference.py. tests/python/test_env_switches.py checks that every
NLPTRAIN_ variable that src/ reads with getenv is a row here, and every NLPTRAIN_ row is read in src/.

Each row: (name, values, default, what it does, the document that explains it)."""

CUDA_README = "src/backend/cuda/README.md"

SWITCHES = [
    ("NLPTRAIN_CUDA_BF16_ACTS", "`native` \\| `staged`", "`native`",
     "bf16 activations (`run.bf16_activations`): ops read and write bf16 directly, or stage through fp32", CUDA_README),
    ("NLPTRAIN_CUDA_BF16_CAST", "`vector` \\| `scalar`", "`vector`",
     "the bf16 operand casts of the GEMMs: vectorised or one element per thread", CUDA_README),
    ("NLPTRAIN_CUDA_FUSED_LN", "`0` \\| unset", "unset (fused)",
     "`0` runs the residual add and LayerNorm as separate ops instead of the fused kernel", CUDA_README),
    ("NLPTRAIN_CUDA_GEMM_EPILOGUES", "`bias` \\| `all` \\| `none` \\| a comma list of kinds (`bias,bgrad`)", "`bias`",
     "which cuBLASLt epilogues the GEMMs fuse (`all` adds GELU_AUX, DGELU and BGRAD)", CUDA_README),
    ("NLPTRAIN_CUDA_HEAD_DLOGITS", "`bf16` \\| `fp32`", "`bf16`",
     "the storage of the LM head's dlogits in bf16 precision", CUDA_README),
    ("NLPTRAIN_CUDA_HEAD_SOFTMAX", "`online` \\| `twopass`", "`online`",
     "the LM head's softmax kernel: one pass with a running max, or the two-pass kernel", CUDA_README),
    ("NLPTRAIN_CUDA_HEAD_WTE", "`bf16` \\| `fp32`", "`bf16`",
     "the fused head's padded copy of wte in bf16 precision: bf16, or the fp32 copy each GEMM rounds", CUDA_README),
    ("NLPTRAIN_CUDA_SEGMENT_CE", "`rows` \\| unset", "unset (segment op)",
     "`rows` runs packed qa's cross-entropy as the row op per example instead of the segment op", CUDA_README),
    ("NLPTRAIN_CUDNN_MASK_BIAS", "`<forward>,<backward>`, each `key` \\| `key0` \\| `full`", "chosen per graph",
     "forces cuDNN attention's mask/bias form, to check each against the others", CUDA_README),
    ("NLPTRAIN_CUDNN_PACKED", "`ragged` \\| `bias`", "chosen per graph",
     "forces cuDNN attention's packed-batch form (ragged offsets or a bias mask)", CUDA_README),
    ("NLPTRAIN_STEP_GRAPH_EMULATE", "`1` \\| unset", "unset",
     "emulates `run.cuda_graph`'s recording and replay on the CPU backend (for the tests)", CUDA_README),
    ("NLPTRAIN_COMM_TRACE", "set \\| unset", "unset",
     "each rank prints its gradient communication times per step on stderr", "src/train/trainer_step.cpp"),
    ("NLPTRAIN_TEST_STALL_RANK", "a rank number", "unset",
     "that rank stops at its first gradient bucket, as a hung rank would (the test that a stuck rank ends the run)",
     "tests/python/test_comm.py"),
    ("NLPRUN_RESIGNAL_S", "seconds", "`2`",
     "tools/nlprun: seconds between SIGUSR1 re-sends to mpirun while the ranks stop", "docs/running.md"),
    ("NLP_RESIGNAL_S", "seconds", "`15`",
     "jobscripts: seconds between SIGUSR1 re-sends while the ranks are stopping", "jobscripts/README.md"),
    ("NLP_STOPFILE_S", "seconds", "`10`",
     "jobscripts with output on node scratch: seconds between looks for RESULTS_DIR/STOP", "jobscripts/README.md"),
]


def table():
    out = ["| variable | values | default | what it does | explained in |", "|---|---|---|---|---|"]
    for name, values, default, what, doc in SWITCHES:
        out.append(f"| `{name}` | {values} | {default} | {what} | `{doc}` |")
    return "\n".join(out)
