# enginekit: `make run` and `make test` are all a new machine needs; both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.enginekit-setup
# ONNX Runtime built for CUDA 13 (see setup); constraints.txt keeps ModelOpt's pin for the resolver
ORT_GPU := onnxruntime-gpu==1.31.1
# A real Triton server for the deploy tests (nvidia-pytriton's tritonserver binary, Python backend) and the
# HTTP client. Both without their declared dependencies: pytriton pins NumPy below 2 for its own Python
# package, which enginekit does not import (only its server binary runs), and tritonclient caps ml-dtypes
# below the ONNX stack's pin; the client's own imports are listed beside it.
TRITON := nvidia-pytriton==0.7.0 tritonclient==2.73.0 geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.3.2 \
	python-rapidjson==1.25 zope.event==6.2 zope.interface==8.7 brotli==1.2.1
OUT    ?= out
export YOLO_OFFLINE ?= 1
export YOLO_CONFIG_DIR ?= $(CURDIR)/$(VENV)/ultralytics-config

.PHONY: setup run test bench bench-pipeline bench-store clean

setup: $(STAMP)

# torch is pinned together with everything else: pip may otherwise pick another build.
# Then ONNX Runtime for CUDA 13 (the libraries torch's wheels bring): 1.24.x, which ModelOpt 0.47 pins,
# links CUDA 12 and cannot use a GPU with them; ModelOpt's INT8/FP8/AutoCast paths pass on 1.31.1, and
# pip's resolver refuses the pin conflict, so a second step replaces it without resolving again.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[all,tensorrt-rtx,test]"
	$(BIN)/pip install -q --no-deps $(ORT_GPU)
	$(BIN)/pip install -q --no-deps $(TRITON)
	$(BIN)/python -m enginekit.checks.setup
	touch $@

# The main job on the embedded default: random-weight yolo12n and Depth-Anything-V2-small,
# exported FP32 and FP16 and checked against PyTorch on photographs shipped in installed packages.
# The random yolo12n depends on the image (it finds detections at conf 0.25): its parity and task checks can fail.
run: setup
	mkdir -p $(OUT)
	$(BIN)/enginekit export yolo12n --random-init -o $(OUT)/yolo12n.onnx
	$(BIN)/enginekit export yolo12n --random-init --fp16 -o $(OUT)/yolo12n.fp16.onnx
	$(BIN)/enginekit export depth --random-init --input 1x3x518x518 -o $(OUT)/depth-anything-v2-small.onnx
	$(BIN)/enginekit export depth --random-init --input 1x3x518x518 --fp16 -o $(OUT)/depth-anything-v2-small.fp16.onnx

test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25

# CPU benchmark of random-weight yolo12n (torch and ONNX Runtime), GPUs hidden so the
# figures are comparable between machines: the report as JSON in $(OUT)/bench.json, a plot beside it.
bench: setup
	mkdir -p $(OUT)
	CUDA_VISIBLE_DEVICES= $(BIN)/enginekit bench yolo12n --random-init --batch 1,2 \
		--backend torch-fp32,onnxruntime-cpu --plot $(OUT)/bench.png --json > $(OUT)/bench.json.tmp
	mv $(OUT)/bench.json.tmp $(OUT)/bench.json

clean:
	rm -rf $(OUT) .pytest_cache

# --- recipes: every recipe built and verified; incremental through the engine cache ----------
# One build and one verify job per recipe, so `make -j` spreads recipes over cores; the cache
# locks each entry it writes, so jobs never build the same thing twice.
# Narrow it: make nightly RECIPE_NAMES="yolo12n depth-anything-v2-small"
RECIPE_DIR   ?= recipes
RECIPE_NAMES ?= $(basename $(notdir $(wildcard $(RECIPE_DIR)/*.yaml)))
REPORTS      ?= reports
ENGINE_JOBS  := $(addprefix engine-,$(RECIPE_NAMES))
VERIFY_JOBS  := $(addprefix verify-,$(RECIPE_NAMES))

.PHONY: nightly engines verify clean-cache $(ENGINE_JOBS) $(VERIFY_JOBS)

# Build and verify every recipe, reports under $(REPORTS)/<recipe>/. -k: every recipe gets its
# report even when another fails its gate; the exit status still says one did.
nightly: setup
	$(MAKE) --no-print-directory -k verify; status=$$?; echo "reports: $(REPORTS)/<recipe>/"; exit $$status

engines: $(ENGINE_JOBS)

verify: $(VERIFY_JOBS)

$(ENGINE_JOBS): engine-%: setup
	$(BIN)/enginekit build $(RECIPE_DIR)/$*.yaml

$(VERIFY_JOBS): verify-%: engine-%
	$(BIN)/enginekit verify $(RECIPE_DIR)/$*.yaml --report $(REPORTS)/$*/

# Empty the engine cache (entries another process is writing are kept).
clean-cache:
	@if [ -x $(BIN)/enginekit ]; then $(BIN)/enginekit cache purge; else echo "no $(BIN)/enginekit: nothing to purge"; fi

# Speed figures of the pipeline (help, export vs Ultralytics, ONNX Runtime latency, cold and
# cache-hit builds, INT8 with a calibration cache, verify with stored references).
bench-pipeline: setup
	mkdir -p $(OUT)
	$(BIN)/python benchmarks/pipeline.py --json $(OUT)/bench-pipeline.json

# The team store on a real S3 server on loopback (SeaweedFS): a remote hit against a cold build of
# yolo12n FP16, pull throughput of a 100 MB entry, load() from the store on an empty cache.
bench-store: setup
	mkdir -p $(OUT)
	$(BIN)/python benchmarks/store.py --json $(OUT)/bench-store.json
