"""The one test kit: start here for a new test (docs/architecture.md "The tests: one kit").

- ``helpers``: run each CLI from source (``run_cli``; ``start_cli`` to start one and go on) or as a
  user runs the zipapp (``run_pyz`` on a bundle, ``run_zipapp`` with any arguments, ``start_pyz``);
  what Docker holds (``image_facts``, ``image_ids``, ``docker``). No test spawns them itself.
- ``fixtures`` (every test sees them): ``pristine``/``pristine_multi`` (read only), ``bundle``/
  ``multi_bundle`` (the test's own copy to damage), ``multi_facts`` (what pristine_multi holds).
- ``engines``: private dockerds, registries, sshd (``docker/scripts/*.sh``), ``unavailable()``
  (fails under CI=true, skips elsewhere), ``build_image``; ``engine_stores``: containerd and podman.
- ``imagegen``: build contexts (``layered_context``: FROM, busybox, files, steps;
  ``base_and_update``: an image and its one-layer update; ``simple_context``; the tricky images;
  CUDA-like images): no test writes a Dockerfile; ``fakesave``: a fake ``docker save`` stream;
  ``bundlegen``: bundles without an engine (pristine, multi-platform); ``layoutgen``: OCI layouts
  (a three-platform index); ``transferkit``: random bundles for carrying, tars and parts;
  ``fileskit``: a model folder, its bundle of files (schema 3.6), hostile edits of its bundle.json;
  ``spacekit``: a small tmpfs mounted for a block (``small_fs``), for out-of-space tests.
- ``trustkit``: keys, signing, tampering, the engine-side security images; ``fuzzkit``: the
  bundle fuzzer, its reference check, and re-pinned damage (``replace_blob``, ``rewrite_index``);
  ``supplykit``: cosign-format signatures and referrers.
- ``servekit``: a running ``bundle-import serve`` (``serving``; its CPU time, ``cpu_seconds``), the
  ``made`` fixture (one bundle as folder, tar and parts) and plain HTTP requests to it, also from
  other loopback addresses (``CLIENTS``: several clients of one server); ``fleetkit``: the importer run under
  another host name (``on_host``) and ``fleet-report`` over the receipts; ``fakeregistry``: a
  loopback registry that misbehaves on request; ``smokekit``: the smoke suite's torch and engine
  set-up; ``gpukit``: a fake ``nvidia-smi`` for hosts without a GPU; ``oci_schemas``: the OCI image-spec
  JSON Schemas every exported document is checked against; ``clijson``: our ``--json`` output
  checked against schemas/cli/ (``validate``, ``ok``, ``failed``, ``export_json``).
"""
