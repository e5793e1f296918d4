/* Callgrind client requests for ctypes: collect only the timed window. No-ops natively.
 * cg_toggle: collection on/off, in the calling thread only (callgrind keeps that state per
 * thread); cg_instrument: instrumentation on/off, for every thread (run with
 * --instr-atstart=no). */
#include <valgrind/callgrind.h>
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_instrument(int on) { if (on) CALLGRIND_START_INSTRUMENTATION; else CALLGRIND_STOP_INSTRUMENTATION; }
int cg_running(void) { return RUNNING_ON_VALGRIND; }
