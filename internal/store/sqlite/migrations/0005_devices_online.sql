-- Paged device lists filtered by presence (GET /v1/devices?online=true|false):
-- the page (online = ? AND device_id > ? ORDER BY device_id LIMIT ?) is one
-- range of this index, in order, and its count reads the index alone, so a
-- fleet of 100,000 devices with a few offline ones is not scanned whole for
-- each page. An unfiltered page walks the primary key.
CREATE INDEX devices_online ON devices(online, device_id);
