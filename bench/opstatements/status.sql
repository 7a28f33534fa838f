SELECT * FROM nudge_campaign_status('tenant-3', 7)
