SELECT r.state, count(*) FROM reminders r
 WHERE r.tenant = 'tenant-3' AND r.key LIKE 'campaign:%' AND r.key ~>=~ 'campaign:7:' AND r.key ~<~ 'campaign:7;'
 GROUP BY r.state
