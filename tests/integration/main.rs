mod job;
