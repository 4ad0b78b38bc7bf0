#include "summarizer.h"

#include <stdlib.h>
#include <string.h>

void
histd_summary_result_clear(histd_summary_result *r)
{
	if (!r)
		return;
	free(r->text);
	free(r->model);
	memset(r, 0, sizeof(*r));
}
