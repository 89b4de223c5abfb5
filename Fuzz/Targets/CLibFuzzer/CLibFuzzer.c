/* Only the header matters: LLVMFuzzerRunDriver comes from libFuzzer's runtime. */
#include "CLibFuzzer.h"
