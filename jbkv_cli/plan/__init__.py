"""``jbkv plan``: a generation's peak device memory, predicted on a CPU by running the real code
path on a fake CUDA device (:mod:`jbkv_cli.utils.fake_cuda`) under a byte tracker."""
