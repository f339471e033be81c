"""One job's run on this node: what each rank runs (``worker``), the job's model and tokenizer (``model``), torchrun
for several processes or nodes (``launch``), Slurm's allocation (``slurm``) and Ray Train's workers instead of
torchrun's (``ray_train``)."""
