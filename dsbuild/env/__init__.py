"""The environment a run meets: installed versions, the tested set, which extra an optional package needs, DeepSpeed's
op-build locks, and ``dsbuild doctor``, which reports on all of them."""
