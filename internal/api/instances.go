package api

import (
	"net/http"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// handleListInstances lists the live instances sharing the database, with
// the leases each holds and its last heartbeat; ?all=1 adds the dead ones.
func (s *Server) handleListInstances(r *http.Request) (int, any, error) {
	lq, err := parseList(r, "all")
	if err != nil {
		return 0, nil, err
	}
	all, err := lq.boolParam("all")
	if err != nil {
		return 0, nil, err
	}
	ins, err := s.cfg.Store.ListInstances(r.Context())
	if err != nil {
		return 0, nil, err
	}
	out := []apiwire.InstanceView{}
	for _, in := range ins {
		if !in.Live && (all == nil || !*all) {
			continue
		}
		out = append(out, apiwire.InstanceView{InstanceID: in.InstanceID, Live: in.Live, Leases: in.Leases,
			StartedAt: in.StartedAt, HeartbeatAt: in.HeartbeatAt, LeaseTTL: in.LeaseTTL.String()})
	}
	return http.StatusOK, out, nil
}
