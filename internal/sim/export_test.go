package sim

// SetSyncHook makes every fsync of the fleet's durable files (journal,
// witness files, snapshots, directories) call h first with the file's name;
// an error from h fails that fsync.
func SetSyncHook(c *Config, h func(file string) error) { c.syncHook = h }
