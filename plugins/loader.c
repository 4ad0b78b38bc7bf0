/*
 * Plugins built outside the tree, as shared objects, loaded at start.
 *
 * The object exports HISTD_PLUGIN_ENTRY (plugin.h); the host calls it with
 * its HISTD_PLUGIN_VERSION, and the plugin it returns is validated and
 * registered like a built-in one. The object stays loaded for the life of
 * the process (registered structs point into it). RTLD_LOCAL: two plugins
 * may define the same helper names without clashing.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

int
histd_plugin_load(const char *path)
{
	histd_plugin_entry_fn entry;
	const histd_plugin *p;
	void *h;
	int rc;

	if (!path || !*path)
		return histd_error_set(HISTD_EINVALID,
				       "plugin path is empty");
	if (!(h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
		return histd_error_set(HISTD_EINVALID,
			"plugin %s cannot be loaded: %s", path, dlerror());
	*(void **)&entry = dlsym(h, HISTD_PLUGIN_ENTRY);
	if (!entry) {
		dlclose(h);
		return histd_error_set(HISTD_EINVALID,
			"plugin %s exports no %s function", path,
			HISTD_PLUGIN_ENTRY);
	}
	if (!(p = entry(HISTD_PLUGIN_VERSION))) {
		dlclose(h);
		return histd_error_set(HISTD_EINVALID,
			"plugin %s does not support plugin version %u", path,
			HISTD_PLUGIN_VERSION);
	}
	if ((rc = histd_plugin_register(p))) {
		dlclose(h);
		return rc;
	}
	/* Deliberately never closed: the registry borrows p. */
	return 0;
}

int
histd_plugin_load_list(const char *paths)
{
	char *copy, *save = NULL;
	int rc = 0;

	if (!paths || !*paths)
		return 0;
	if (!(copy = strdup(paths)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	for (char *t = strtok_r(copy, ",", &save); t && !rc;
	     t = strtok_r(NULL, ",", &save))
		if (*t)
			rc = histd_plugin_load(t);
	free(copy);
	return rc;
}
