SELECT s.state, count(*) FROM reminders r JOIN reminder_state s ON s.id = r.id
 WHERE r.tenant = 'tenant-3' AND r.key LIKE 'campaign:%' AND r.key ~>=~ 'campaign:7:' AND r.key ~<~ 'campaign:7;'
 GROUP BY s.state
