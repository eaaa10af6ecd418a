#!/bin/bash
grep ok notes.txt > report.txt
