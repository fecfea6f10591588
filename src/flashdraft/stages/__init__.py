"""The stage layer: one module per `flashdraft STAGE` command (parse -> config -> one library call ->
print and log). The only place that knows argv and prints for users."""

# name -> (module, one-line help)
STAGES: dict[str, tuple[str, str]] = {
    "draft-init": ("flashdraft.stages.draft_init", "write a fresh DFlash draft checkpoint for a target"),
    "warmup": ("flashdraft.stages.warmup",
               "materialise and check the target, regenerate training answers with it"),
    "prepare-data": ("flashdraft.stages.prepare_data",
                     "tokenise the training data once, on a CPU, into the cache the trainer reads"),
    "train": ("flashdraft.stages.train", "train a draft against the frozen target (alone or under torchrun)"),
    "evaluate": ("flashdraft.stages.evaluate",
                 "tau, speedup and losslessness of a draft on benchmarks, with baselines"),
    "dllm-evaluate": ("flashdraft.stages.dllm_evaluate",
                      "held-out masked-token loss/accuracy and a sample of a diffusion LM"),
    "promote": ("flashdraft.stages.promote",
                "register a trained draft in MLflow and move champion/challenger by policy"),
    "launch": ("flashdraft.stages.launch",
               "run training as torchrun here, or as a PyTorchJob or TrainJob on Kubernetes"),
    "run": ("flashdraft.stages.run", "run a pipeline file here with kfp's local runner (--local)"),
    "submit": ("flashdraft.stages.submit", "compile a pipeline file and create a run on Kubeflow Pipelines"),
}
