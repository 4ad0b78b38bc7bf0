/*
 * Sanitizer defaults baked into every fuzz binary, so that a target run by
 * hand behaves as under ctest: UBSan stops at the first report (its known
 * open bugs suppressed: ubsan.supp), with a stack.
 */
const char *__ubsan_default_options(void);

const char *
__ubsan_default_options(void)
{
	return "halt_on_error=1:print_stacktrace=1:suppressions="
	       HISTD_FUZZ_UBSAN_SUPP;
}
