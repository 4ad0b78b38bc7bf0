/*
 * The conformance suite on the file driver. Each test gets a new, empty
 * data directory under $TMPDIR (fsync=batch, the default) that the fixture
 * removes with everything in it once the driver is closed.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"

typedef struct store {
	char dir[256];
} store;

static int store_new(void *ctx, histd_driver_config *cfg, void **out)
{
	const char *tmp = getenv("TMPDIR");
	store *s = calloc(1, sizeof(*s));

	(void)ctx;
	if (!s)
		return HISTD_ENOMEM;
	snprintf(s->dir, sizeof(s->dir), "%s/histd-file-conf-XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(s->dir)) {
		free(s);
		return HISTD_EUNAVAILABLE;
	}
	cfg->data_dir = s->dir;
	cfg->fsync_mode = "batch";
	*out = s;
	return 0;
}

/* The data directory holds files only (the driver makes no subfolders). */
static void store_free(void *ctx, void *p)
{
	store *s = p;
	struct dirent *e;
	DIR *dir;

	(void)ctx;
	if (!s)
		return;
	dir = opendir(s->dir);
	if (dir) {
		while ((e = readdir(dir)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
				unlinkat(dirfd(dir), e->d_name, 0);
		closedir(dir);
	}
	rmdir(s->dir);
	free(s);
}

int main(void)
{
	const histd_conformance_fixture fx = {
		.driver = "file",
		.read_budget = 1,
		.store_new = store_new,
		.store_free = store_free,
	};

	return histd_conformance_run(&fx) ? 1 : 0;
}
