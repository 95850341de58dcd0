// Threads of the CPU backend (the FFN reference and LlamaCpu): its loops run on up to num_threads()
// threads, with results that do not depend on the count.
#pragma once

namespace twell::cpu {

// Threads the CPU backend may use: set_num_threads(n) if n > 0 was set, else the environment
// variable TWELL_NUM_THREADS (read at every call; 0 or unset: the default), else
// std::thread::hardware_concurrency(). Always >= 1; throws for a TWELL_NUM_THREADS that is no
// integer in [0, 4096].
int num_threads();

// Sets the thread count for this process (0 restores the default above) and returns the previous
// setting. Safe from any thread (an embedding program need not setenv TWELL_NUM_THREADS); a loop
// already running keeps the count it started with.
int set_num_threads(int n);

}  // namespace twell::cpu
