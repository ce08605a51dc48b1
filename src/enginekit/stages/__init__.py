"""Pipeline stages: export, simplify, fp16, int8, fp8. Each is a function from files to a file."""
