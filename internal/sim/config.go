package sim

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/fleetctl/fleetctl/internal/wire"
)

// Defaults of Config.
const (
	DefaultIDPrefix             = "device-"
	DefaultKeepAlive            = 5 * time.Second
	DefaultMaxReconnectInterval = time.Second
	DefaultConnectTimeout       = 5 * time.Second
	DefaultPublishTimeout       = 5 * time.Second
	DefaultRetention            = 24 * time.Hour
)

// Config configures a simulated fleet.
type Config struct {
	// MQTT is the broker URL, tcp://host:port (or mqtt://), or
	// ssl://host:port (tls://, mqtts://) for TLS.
	MQTT string
	// Devices is how many devices to run, numbered from 1 with IDPrefix:
	// IDPrefix "device-" and Devices 3 give device-1, device-2, device-3.
	Devices int
	// IDPrefix defaults to "device-".
	IDPrefix string
	// IDs, when set, names the devices instead of Devices and IDPrefix.
	IDs []string
	// StateDir holds each device's durable state (snapshots
	// devices/<id>.json and the fleet's journal devices/*.journal) and the
	// witness files executions.jsonl and receipts.jsonl. Required.
	StateDir string
	// TopicRoot defaults to wire.DefaultTopicRoot ("fleet").
	TopicRoot string
	// Password, if set, is every device's MQTT password (the user name is
	// the device id).
	Password string
	// Passwords, if set, holds each device's own MQTT password by device
	// id (credentials.json of `devicesim creds`); every device must have
	// one. It replaces Password.
	Passwords map[string]string
	// TLS configures the connections of an ssl:// URL: the CA the broker's
	// certificate must chain to (nil: the system's roots). The server name
	// defaults to the URL's host.
	TLS *tls.Config
	// Faults is the fault profile; the zero value is a conforming fleet.
	Faults Profile
	// Seed seeds the fault decisions (each device draws from its own
	// source seeded by Seed and its id). 0: Faults.Seed, and if that is 0
	// too, 1.
	Seed int64
	// KeepAlive is the MQTT keepalive (whole seconds, at least 1s): the
	// broker fires a silent device's LWT after 1.5 times it.
	KeepAlive time.Duration
	// MaxReconnectInterval caps the back-off between reconnect attempts.
	MaxReconnectInterval time.Duration
	// ConnectTimeout bounds one connection attempt.
	ConnectTimeout time.Duration
	// PublishTimeout bounds the waits for a birth, a subscription and the
	// shutdown's offline presence, and the flush of receipts at Stop.
	PublishTimeout time.Duration
	// Retention is how long past a command's expires_at (or arrival, for a
	// command without one) its record is kept for dedupe.
	Retention time.Duration
	// JournalCompactAt is the fleet journal's size past which it is folded
	// into the devices' snapshot files (device.JournalOptions.CompactAt;
	// 0: device.DefaultCompactAt). Each fold rewrites every device's
	// snapshot, all its records within Retention: a fleet of many devices
	// at thousands of commands a second folds often, and each fold takes
	// seconds of CPU and writes.
	JournalCompactAt int64
	// Clock is the device clock before skew; time.Now when nil.
	Clock func() time.Time
	// Logger receives the simulator's logs; nothing is logged when nil.
	Logger *slog.Logger

	// syncHook, when set, runs before every fsync of the fleet's durable
	// files (journal, witnesses, snapshots, directories) with the file's
	// name; an error fails that fsync. Tests set it (export_test.go).
	syncHook func(file string) error
}

func (c Config) withDefaults() Config {
	if c.IDPrefix == "" {
		c.IDPrefix = DefaultIDPrefix
	}
	if c.TopicRoot == "" {
		c.TopicRoot = wire.DefaultTopicRoot
	}
	if c.Seed == 0 {
		c.Seed = c.Faults.Seed
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = DefaultKeepAlive
	}
	if c.MaxReconnectInterval == 0 {
		c.MaxReconnectInterval = DefaultMaxReconnectInterval
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// password is device id's MQTT password ("" for none).
func (c Config) password(id string) string {
	if c.Passwords != nil {
		return c.Passwords[id]
	}
	return c.Password
}

// ids returns the device ids the config names.
func (c Config) ids() []string {
	if len(c.IDs) > 0 {
		return c.IDs
	}
	ids := make([]string, c.Devices)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", c.IDPrefix, i+1)
	}
	return ids
}

func (c Config) validate() error {
	var errs []error
	u, err := url.Parse(c.MQTT)
	if err == nil {
		err = wire.CheckScheme(u.Scheme)
	}
	switch {
	case c.MQTT == "":
		errs = append(errs, errors.New("mqtt: broker URL is required"))
	case err != nil:
		errs = append(errs, fmt.Errorf("mqtt: %w", err))
	case u.Port() == "":
		errs = append(errs, fmt.Errorf("mqtt: %q has no port", c.MQTT))
	case c.TLS != nil && !wire.TLSScheme(u.Scheme):
		errs = append(errs, fmt.Errorf("mqtt: a TLS configuration (a CA) is for ssl:// URLs; %s is plain TCP", c.MQTT))
	}
	if len(c.IDs) == 0 && c.Devices < 1 {
		errs = append(errs, errors.New("devices: want at least 1"))
	}
	seen := map[string]bool{}
	for _, id := range c.ids() {
		if !wire.ValidDeviceID(id) {
			errs = append(errs, fmt.Errorf("device id %q: %w", id, wire.ErrInvalidDeviceID))
		}
		if seen[id] {
			errs = append(errs, fmt.Errorf("device id %q given twice", id))
		}
		seen[id] = true
		if c.Passwords != nil && c.Passwords[id] == "" {
			errs = append(errs, fmt.Errorf("device %q: no password in the credentials", id))
		}
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("state dir is required"))
	}
	if c.TopicRoot == "" || strings.ContainsAny(c.TopicRoot, "+#") {
		errs = append(errs, fmt.Errorf("topic root %q: must be non-empty, without wildcards", c.TopicRoot))
	}
	if c.KeepAlive < time.Second {
		errs = append(errs, errors.New("keepalive: at least 1s"))
	}
	if c.MaxReconnectInterval < 0 || c.ConnectTimeout < 0 || c.PublishTimeout < 0 || c.Retention < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	if c.JournalCompactAt < 0 {
		errs = append(errs, errors.New("journal compaction size must not be negative"))
	}
	if err := c.Faults.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
