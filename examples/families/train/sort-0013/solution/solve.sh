#!/bin/bash
sort data.txt > report.txt
