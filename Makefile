# enginekit: `make run` and `make test` are all a new machine needs; both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.enginekit-setup
OUT    ?= out
export YOLO_OFFLINE ?= 1
export YOLO_CONFIG_DIR ?= $(CURDIR)/$(VENV)/ultralytics-config

.PHONY: setup run test help-time bench clean

setup: $(STAMP)

# torch is pinned together with everything else: pip may otherwise pick another build.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[all,tensorrt-rtx,test]"
	$(BIN)/python -m enginekit.checks.setup
	touch $@

# The main job on the embedded default: random-weight yolo12n and Depth-Anything-V2-small,
# exported FP32 and FP16 and checked against PyTorch on photographs shipped in installed packages.
run: setup
	mkdir -p $(OUT)
	$(BIN)/enginekit export yolo12n --random-init -o $(OUT)/yolo12n.onnx
	$(BIN)/enginekit export yolo12n --random-init --fp16 -o $(OUT)/yolo12n.fp16.onnx
	$(BIN)/enginekit export depth --random-init --input 1x3x518x518 -o $(OUT)/depth-anything-v2-small.onnx
	$(BIN)/enginekit export depth --random-init --input 1x3x518x518 --fp16 -o $(OUT)/depth-anything-v2-small.fp16.onnx

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(OUT) .pytest_cache
