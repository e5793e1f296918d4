/* Callgrind client requests for ctypes: collect only the timed window. No-ops natively. */
#include <valgrind/callgrind.h>
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
int cg_running(void) { return RUNNING_ON_VALGRIND; }
