package plan

import (
	"cmp"
	"slices"
)

// The roles, spelled as the gateway's configuration spells them (lb/config
// imports this package, not the reverse).
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Instance is one prefill or decode pod of a model's pool, as an actuator
// sees it.
type Instance struct {
	Name    string
	Address string
	// Auth is the Authorization value of the pod's API key, which its
	// admin calls carry ("" when it has none).
	Auth    string
	Role    string // RolePrefill or RoleDecode
	Roleset string
	// InFlight is the requests the gateway has on the pod: moving a busy
	// pod costs a longer drain.
	InFlight int64
}

// Change gives one instance a new role or roleset.
type Change struct {
	Name    string
	Role    string
	Roleset string
	// Switch says the role changes, so the instance drains and warms up
	// first; otherwise only its roleset changes, at no cost to it.
	Switch bool
	// BootstrapPort is the KV bootstrap port the pod reports in its new
	// prefill role (what SGLang decode pods connect to); 0 keeps the
	// configured one.
	BootstrapPort int
}

// Reassign decides which instances of pool take which role, and which
// roleset each joins, for the pool to run target. A prefill pod pairs only
// with decode pods of its own roleset, so every roleset must keep at least
// one pod of each role or its pods serve nothing. The rule:
//
//  1. The instances to move are taken one by one from the rolesets with
//     the most pods of the old role (a roleset gives up its last one only
//     when every roleset is down to one), the least busy first, then by
//     name.
//  2. Each joins, in its new role, the roleset with the fewest pods of that
//     role among those that still hold a pod of the other role (so it has
//     a partner); its own roleset first on a tie, then by name.
//  3. Regroup then dissolves every roleset left with one role only.
//
// With target equal to the pool's split it returns no changes. The result
// is sorted by name; pool is not modified.
func Reassign(pool []Instance, target Ratio) []Change {
	after := slices.Clone(pool)
	sets := countRoles(after)
	from, to, n := RoleDecode, RolePrefill, target.Prefill-countRole(after, RolePrefill)
	if n < 0 {
		from, to, n = RolePrefill, RoleDecode, -n
	}
	var changes []Change
	for ; n > 0; n-- {
		i := pickMover(after, sets, from)
		if i < 0 {
			break // the pool holds fewer instances than target places
		}
		in := &after[i]
		sets[in.Roleset][from]--
		dest := pickRoleset(sets, in.Roleset, from, to)
		sets[dest][to]++
		in.Role, in.Roleset = to, dest
		changes = append(changes, Change{Name: in.Name, Role: to, Roleset: dest, Switch: true})
	}
	changes = append(changes, Regroup(after)...)
	slices.SortFunc(changes, func(a, b Change) int { return cmp.Compare(a.Name, b.Name) })
	return changes
}

// Regroup dissolves the rolesets of pool that hold pods of one role only
// (their pods would pair with no one): each of their pods joins, in its
// role, the complete roleset with the fewest pods of that role (ties by
// name). It returns the roleset changes, none when every roleset is
// complete or none is.
func Regroup(pool []Instance) []Change {
	sets := countRoles(pool)
	var complete []string
	for name, c := range sets {
		if c[RolePrefill] > 0 && c[RoleDecode] > 0 {
			complete = append(complete, name)
		}
	}
	if len(complete) == 0 {
		return nil
	}
	slices.Sort(complete)
	var changes []Change
	for _, in := range sortedByName(pool) {
		if c := sets[in.Roleset]; c[RolePrefill] > 0 && c[RoleDecode] > 0 {
			continue
		}
		dest := complete[0]
		for _, name := range complete[1:] {
			if sets[name][in.Role] < sets[dest][in.Role] {
				dest = name
			}
		}
		sets[dest][in.Role]++
		changes = append(changes, Change{Name: in.Name, Role: in.Role, Roleset: dest})
	}
	return changes
}

// roleCounts counts a roleset's pods by role.
type roleCounts map[string]int

func countRoles(pool []Instance) map[string]roleCounts {
	sets := map[string]roleCounts{}
	for _, in := range pool {
		if sets[in.Roleset] == nil {
			sets[in.Roleset] = roleCounts{}
		}
		sets[in.Roleset][in.Role]++
	}
	return sets
}

func countRole(pool []Instance, role string) int {
	n := 0
	for _, in := range pool {
		if in.Role == role {
			n++
		}
	}
	return n
}

// pickMover is rule 1: the index of the next instance of role from to
// move, -1 when none is left.
func pickMover(pool []Instance, sets map[string]roleCounts, from string) int {
	best := -1
	for i, in := range pool {
		if in.Role != from {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := pool[best]
		if c := cmp.Or(cmp.Compare(sets[b.Roleset][from], sets[in.Roleset][from]),
			cmp.Compare(in.InFlight, b.InFlight), cmp.Compare(in.Name, b.Name)); c < 0 {
			best = i
		}
	}
	return best
}

// pickRoleset is rule 2: where an instance leaving own for role to goes.
// At least one roleset holds a pod of role from whenever the target keeps
// one of that role; failing that it stays in own.
func pickRoleset(sets map[string]roleCounts, own, from, to string) string {
	best := ""
	for _, name := range sortedKeys(sets) {
		c := sets[name]
		if c[from] == 0 {
			continue
		}
		switch {
		case best == "",
			c[to] < sets[best][to],
			c[to] == sets[best][to] && name == own:
			best = name
		}
	}
	if best == "" {
		return own
	}
	return best
}

func sortedKeys(sets map[string]roleCounts) []string {
	keys := make([]string, 0, len(sets))
	for k := range sets {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedByName(pool []Instance) []Instance {
	out := slices.Clone(pool)
	slices.SortFunc(out, func(a, b Instance) int { return cmp.Compare(a.Name, b.Name) })
	return out
}
