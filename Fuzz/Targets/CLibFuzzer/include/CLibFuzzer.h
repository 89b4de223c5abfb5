#ifndef CLIBFUZZER_H
#define CLIBFUZZER_H
#include <stddef.h>
#include <stdint.h>

/* libFuzzer's driver (compiler-rt, LLVM 11 and later), linked by -sanitize=fuzzer: parses
   libFuzzer's own flags from argv and runs `callback` on each input. */
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

#endif
