"""The one test kit: start here for a new test.

- ``helpers``: run each CLI from source (``run_cli``) or as a user runs the zipapp (``run_pyz``);
  what Docker holds (``image_facts``, ``image_ids``, ``docker``).
- ``engines``: private dockerds, registries, sshd (``docker/scripts/*.sh``), ``unavailable()``
  (fails under CI=true, skips elsewhere); ``engine_stores``: containerd and podman stores.
- ``imagegen``: build contexts (``simple_context``: busybox + a file, tricky content, CUDA-like
  images); ``fakesave``: a fake ``docker save`` stream; ``bundlegen``: bundles without an engine
  (pristine, multi-platform); ``transferkit``: random bundles for carrying, tars and parts.
- ``trustkit``: keys, signing, tampering, the engine-side security images; ``fuzzkit``: the
  bundle fuzzer and its reference check; ``supplykit``: cosign-format signatures and referrers.
- ``servekit``: a running ``bundle-import serve``; ``fakeregistry``: a loopback registry that
  misbehaves on request; ``smokekit``: the smoke suite's torch and engine set-up;
  ``gpukit``: a fake ``nvidia-smi`` for hosts without a GPU; ``oci_schemas``: the OCI image-spec
  JSON Schemas every exported document is checked against.
"""
