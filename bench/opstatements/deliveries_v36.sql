SELECT s.state, count(*)
  FROM (SELECT min(id) AS lo, max(id) AS hi
          FROM (SELECT r.id, r.id - row_number() OVER (ORDER BY r.id) AS run FROM reminders r WHERE r.tenant = 'tenant-3' AND r.key LIKE 'campaign:%' AND r.key ~>=~ 'campaign:7:' AND r.key ~<~ 'campaign:7;') k
         GROUP BY run) i
  JOIN LATERAL (SELECT s.state FROM reminder_state s WHERE s.id BETWEEN i.lo AND i.hi) s ON true
 GROUP BY s.state
